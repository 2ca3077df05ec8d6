"""Read a GGUF file's tensor directory and decode its Q4_1 blocks by hand, with numpy only.

GGUF (Gerganov et al., the ggml/llama.cpp file format) is a small header, a list of key/value
metadata, a directory of tensors (name, shape, type, offset) and then the tensor bytes, aligned.
Q4_1 stores weights in blocks of 32 along a row:

    bytes 0-1   d, fp16   the step between codes
    bytes 2-3   m, fp16   the block's minimum
    bytes 4-19  16 bytes of 4-bit codes q: byte i holds weight i in its low nibble and
                weight i + 16 in its high nibble
    weight = d * q + m

20 bytes per 32 weights: 5 bits per weight. `gguf.quants.dequantize` from the `gguf` package is the
reference; tests check this decoder against it bit for bit on the shipped SmolLM2 file.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Q4_1_TYPE = 3  # ggml's type id for Q4_1
Q4_1_BLOCK_WEIGHTS = 32
Q4_1_BLOCK_BYTES = 20  # 2 (d) + 2 (m) + 16 (32 codes of 4 bits)
Q4_1_BITS_PER_WEIGHT = 8 * Q4_1_BLOCK_BYTES / Q4_1_BLOCK_WEIGHTS

# ggml type id -> (name, weights per block, bytes per block), for the types found in common files.
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    30: ("BF16", 1, 2),
}

# Metadata value types: id -> struct format (8 = string and 9 = array are handled apart).
_SCALAR_FORMATS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (rows, cols); GGUF lists dimensions fastest-first
    ggml_type: int
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (f"type {self.ggml_type}",))[0]


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.take("Q")
        text = self.data[self.pos : self.pos + length].decode("utf-8", errors="replace")
        self.pos += length
        return text

    def value(self, value_type: int):
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.take("I"), self.take("Q")
            return [self.value(item_type) for _ in range(count)]
        return self.take(_SCALAR_FORMATS[value_type])


def read_directory(path) -> tuple[dict, dict[str, TensorInfo]]:
    """(metadata dict, tensors by name) of a GGUF file, parsed from its header (cached per file)."""
    return _read_directory(str(Path(path).resolve()))


@functools.lru_cache(maxsize=4)
def _read_directory(path: str):
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _parse_directory(data, path)


def _parse_directory(data, path):
    cursor = _Cursor(data)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
    cursor.pos = 4
    version, n_tensors, n_metadata = cursor.take("I"), cursor.take("Q"), cursor.take("Q")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported (need 2 or 3)")
    metadata = {}
    for _ in range(n_metadata):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.take("I"))
    entries = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = [cursor.take("Q") for _ in range(cursor.take("I"))]
        entries.append((name, tuple(reversed(dims)), cursor.take("I"), cursor.take("Q")))
    alignment = metadata.get("general.alignment", 32)
    data_start = -(-cursor.pos // alignment) * alignment  # round up to the alignment
    tensors = {}
    for name, shape, ggml_type, offset in entries:
        _, per_block, block_bytes = GGML_TYPES.get(ggml_type, (None, 1, 0))
        tensors[name] = TensorInfo(
            name,
            shape,
            ggml_type,
            data_start + offset,
            int(np.prod(shape)) // per_block * block_bytes,
        )
    return metadata, tensors


def raw_bytes(path, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as stored, a read-only uint8 array (memory-mapped, nothing copied)."""
    return np.memmap(
        Path(path), dtype=np.uint8, mode="r", offset=info.offset, shape=(info.n_bytes,)
    )


def decode_q4_1_blocks(blocks: np.ndarray) -> np.ndarray:
    """uint8 [n_blocks, 20] -> float32 [n_blocks, 32]: d * q + m for each block."""
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, Q4_1_BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)  # [n, 1]
    packed = blocks[:, 4:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=1)  # weights 0..15, then 16..31
    return d * codes.astype(np.float32) + m


def dequantize_q4_1(path, name: str) -> np.ndarray:
    """The named Q4_1 tensor of a GGUF file, decoded to float32 in numpy order [rows, cols]."""
    _, tensors = read_directory(path)
    if name not in tensors:
        raise ValueError(
            f"no tensor {name!r} in {path}; it has e.g. {', '.join(list(tensors)[:5])}"
        )
    info = tensors[name]
    if info.ggml_type != Q4_1_TYPE:
        q4_1 = [n for n, t in tensors.items() if t.ggml_type == Q4_1_TYPE][:3]
        raise ValueError(
            f"{name} is {info.type_name}, not Q4_1; Q4_1 tensors include {', '.join(q4_1)}"
        )
    return decode_q4_1_blocks(raw_bytes(path, info)).reshape(info.shape)
