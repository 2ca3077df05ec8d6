"""The hand-written GGUF reader and Q4_1 decoder against the `gguf` package, on the shipped file."""

import numpy as np
import pytest

from memwall import gguf_q4

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def shipped():
    from memwall.models import gguf_path

    try:
        path = gguf_path()
    except ValueError as error:
        pytest.skip(str(error))
    return path, gguf.GGUFReader(path)


def test_q4_1_is_five_bits_per_weight():
    assert gguf_q4.Q4_1_BITS_PER_WEIGHT == 5.0


def test_a_hand_made_block_decodes_to_d_times_q_plus_m():
    d, m = np.float16(0.125), np.float16(-1.0)
    codes = np.arange(32) % 16
    packed = (codes[:16] | (codes[16:] << 4)).astype(
        np.uint8
    )  # weight i and weight i + 16 share a byte
    block = np.concatenate([np.array([d]).view(np.uint8), np.array([m]).view(np.uint8), packed])
    assert block.size == gguf_q4.Q4_1_BLOCK_BYTES
    decoded = gguf_q4.decode_q4_1_blocks(block[None])
    np.testing.assert_array_equal(
        decoded[0], np.float32(d) * codes.astype(np.float32) + np.float32(m)
    )


def test_directory_matches_the_gguf_package(shipped):
    path, reader = shipped
    metadata, tensors = gguf_q4.read_directory(path)
    assert metadata["general.architecture"] == "llama"
    assert set(tensors) == {t.name for t in reader.tensors}
    for ref in reader.tensors:
        ours = tensors[ref.name]
        assert ours.offset == ref.data_offset and ours.n_bytes == ref.n_bytes
        assert ours.shape == tuple(int(n) for n in reversed(ref.shape)) and ours.ggml_type == int(
            ref.tensor_type
        )


def test_q4_1_decoder_is_bit_for_bit_the_gguf_package(shipped):
    path, reader = shipped
    checked = 0
    for ref in reader.tensors:
        if int(ref.tensor_type) != gguf_q4.Q4_1_TYPE or not ref.name.startswith(
            ("blk.0.", "blk.29.")
        ):
            continue
        ours = gguf_q4.dequantize_q4_1(path, ref.name)
        expected = gguf.quants.dequantize(ref.data, ref.tensor_type)
        assert ours.shape == expected.shape and ours.dtype == np.float32
        assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32)), ref.name
        checked += 1
    assert checked == 14  # q, k, v, output, gate, up, down in two blocks


def test_tensor_bytes_are_20_per_32_weights(shipped):
    path, _ = shipped
    _, tensors = gguf_q4.read_directory(path)
    info = tensors["blk.0.ffn_down.weight"]
    assert info.type_name == "Q4_1" and info.n_bytes == np.prod(info.shape) // 32 * 20


def test_non_q4_1_tensors_are_refused(shipped):
    path, _ = shipped
    with pytest.raises(ValueError, match="not Q4_1"):
        gguf_q4.dequantize_q4_1(path, "output_norm.weight")
    with pytest.raises(ValueError, match="no tensor"):
        gguf_q4.dequantize_q4_1(path, "blk.99.nothing")
