"""Chapter 7 exercises (solutions notebook; `memwall exercises` makes the student copy)."""

from nbcells import check, code, exercise, md, notebook


def build():
    return notebook("07_quantization_solutions", [
        md("""
        # Exercises 7: quantization

        Four pieces of chapter 7, written by you. Each has a widget that draws your function next to
        memwall's; until you fill it in, the widget says "not implemented yet". The check cell under each
        exercise tests your function on hidden random cases.
        """),
        md("""
        ## Exercise 1: bits per weight

        A group-wise format stores a `code_bits`-bit code for every weight. Each group of `group_size`
        weights also stores `metadata_bits` bits of metadata (a 16-bit scale and a 16-bit offset make 32),
        which its weights share. Return the storage bits per weight.
        """),
        exercise("ch07.bits_per_weight", "the code, plus the group's metadata shared by its weights", '''
        def bits_per_weight(code_bits, group_size, metadata_bits):
            """Storage bits per weight of a group-wise quantized format."""
            ### BEGIN SOLUTION
            return code_bits + metadata_bits / group_size
            ### END SOLUTION
        '''),
        md("""
        The widget puts your function inside the decode ceiling of SmolLM2-135M (134.5 M parameters):
        tokens/s ≤ bandwidth / (parameters × bits per weight / 8). Slide the bandwidth and the code width,
        and watch how little the group size matters beyond 64.
        """),
        code('''
        from memwall.grading.checks.ch07 import reference_bits_per_weight
        from memwall.widgets import compare_plot

        SMOLLM2_PARAMS = 134.5e6

        def ceiling_with(bits_fn):
            def ceiling(group_size, code_bits, metadata_bits, bandwidth_gb_s):
                return bandwidth_gb_s * 1e9 / (SMOLLM2_PARAMS
                                               * bits_fn(code_bits, group_size, metadata_bits) / 8)
            return ceiling

        compare_plot(ceiling_with(bits_per_weight), ceiling_with(reference_bits_per_weight),
                     x=("group_size", [8, 16, 32, 64, 128, 256, 512, 1024]),
                     sliders={"code_bits": [4, 8, 3, 2], "metadata_bits": [32, 16, 0],
                              "bandwidth_gb_s": (10, 400, 10, 20)},
                     logx=True, xlabel="group size (weights sharing one scale and offset)",
                     ylabel="decode ceiling (tokens/s)")
        '''),
        check("ch07.bits_per_weight", "bits_per_weight", 1),
        md("""
        ## Exercise 2: symmetric quantization, and what an outlier does

        Quantize each row of the 2-D numpy array `w` symmetrically to `bits` bits. The codes run from
        $-L$ to $L$ with $L = 2^{\\text{bits}-1} - 1$ (127 for int8, 7 for int4); the row's scale is
        $\\max|w_\\text{row}| / L$; each weight becomes round(w / scale), clipped to $[-L, L]$. Return the
        **dequantized** array (codes × scale), so it can be compared with `w`.
        """),
        exercise("ch07.symmetric_quantize", "per-row scale = max|w| / (2**(bits-1) - 1); round, clip, multiply back", '''
        import numpy as np

        def symmetric_quantize(w, bits):
            """Per-row absmax quantization to `bits` bits, returned dequantized
            (same shape as w)."""
            ### BEGIN SOLUTION
            w = np.asarray(w, dtype=np.float32)
            levels = 2 ** (bits - 1) - 1
            scale = np.abs(w).max(axis=1, keepdims=True) / levels
            scale = np.where(scale == 0, 1, scale)
            return np.clip(np.round(w / scale), -levels, levels) * scale
            ### END SOLUTION
        '''),
        md("""
        The error against the number of bits, on a fixed random matrix. The `outlier` slider multiplies one
        weight in every row: a row's scale follows its largest weight, so one outlier coarsens the grid of
        all the others. That is why int4 formats use small groups.
        """),
        code('''
        from memwall.grading.checks.ch07 import reference_symmetric_quantize, relative_rms_error

        compare_plot(lambda bits, outlier: relative_rms_error(symmetric_quantize, bits, outlier),
                     lambda bits, outlier:
                         relative_rms_error(reference_symmetric_quantize, bits, outlier),
                     x=("bits", [2, 3, 4, 5, 6, 7, 8]), sliders={"outlier": (1.0, 50.0, 1.0, 1.0)},
                     logy=True, xlabel="bits per code", ylabel="relative RMS error")
        '''),
        check("ch07.symmetric_quantize", "symmetric_quantize", 2),
        md("""
        ## Exercise 3: two int4 codes in one byte

        `codes` is a 1-D array of even length with values 0…15. Pack it into half as many bytes
        (`np.uint8`): the code at an even index goes into the **low** nibble (bits 0–3), the next code into
        the **high** nibble (bits 4–7). So `[0x3, 0xA]` packs to the single byte `0xA3`. This is the layout
        of `memwall.engine.quant.pack_int4`.
        """),
        exercise("ch07.pack_int4", "even index in bits 0-3, odd index shifted left by 4", '''
        def pack_int4(codes):
            """Two 4-bit codes per byte: even index in the low nibble,
            odd index in the high nibble."""
            ### BEGIN SOLUTION
            codes = np.asarray(codes, dtype=np.uint8)
            return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
            ### END SOLUTION
        '''),
        md("The byte your function makes from the pair [low, high], for every low code; the slider sets the high one."),
        code('''
        from memwall.grading.checks.ch07 import packed_byte, reference_pack_int4

        compare_plot(lambda low, high: packed_byte(pack_int4, low, high),
                     lambda low, high: packed_byte(reference_pack_int4, low, high),
                     x=("low", list(range(16))), sliders={"high": (0, 15, 1, 10)},
                     xlabel="code in the low nibble", ylabel="packed byte value")
        '''),
        check("ch07.pack_int4", "pack_int4", 1),
        md("""
        ## Exercise 4: a GGUF Q4_1 block decoder

        `block` is 20 bytes (`np.uint8`): an fp16 step `d` (bytes 0–1), an fp16 minimum `m` (bytes 2–3), and
        16 bytes of codes. Byte `i` of the codes holds weight `i` in its low nibble and weight `i + 16` in
        its high nibble. Note that this differs from Exercise 3: the two weights in a byte are 16 apart, not
        neighbours. Return the 32 weights as `np.float32`: $x = d\\,q + m$.
        (`array[0:2].view(np.float16)` reads two bytes as an fp16 number.)
        """),
        exercise("ch07.decode_q4_1_block", "d and m are fp16 at bytes 0-1 and 2-3; low nibbles are weights 0-15", '''
        def decode_q4_1_block(block):
            """One Q4_1 block (20 bytes) -> its 32 weights, float32."""
            ### BEGIN SOLUTION
            block = np.asarray(block, dtype=np.uint8)
            d = np.float32(block[0:2].view(np.float16)[0])
            m = np.float32(block[2:4].view(np.float16)[0])
            codes = np.concatenate([block[4:20] & 0x0F, block[4:20] >> 4]).astype(np.float32)
            return d * codes + m
            ### END SOLUTION
        '''),
        md("""
        A block with codes 0, 1, …, 15, 15, 14, …, 0, decoded by your function: the sliders set its `d` and `m`.
        """),
        code('''
        from memwall.grading.checks.ch07 import make_q4_1_block, reference_decode_q4_1_block

        ramp = list(range(16)) + list(range(15, -1, -1))
        compare_plot(lambda index, d, m:
                         float(decode_q4_1_block(make_q4_1_block(d, m, ramp))[index]),
                     lambda index, d, m:
                         float(reference_decode_q4_1_block(make_q4_1_block(d, m, ramp))[index]),
                     x=("index", list(range(32))),
                     sliders={"d": (0.01, 0.2, 0.01, 0.05), "m": (-1.5, 0.5, 0.1, -0.4)},
                     xlabel="weight index in the block", ylabel="decoded weight")
        '''),
        md("Your decoder on the first block of a real tensor in the shipped GGUF file, next to memwall's:"),
        code('''
        from memwall import gguf_q4, models

        try:
            path = models.gguf_path()
            info = gguf_q4.read_directory(path)[1]["blk.0.ffn_down.weight"]
            first_block = np.array(gguf_q4.raw_bytes(path, info)[:20])
            yours = decode_q4_1_block(first_block)
            print("yours:   ", np.round(yours[:6], 5))
            print("memwall: ", np.round(gguf_q4.decode_q4_1_blocks(first_block)[0, :6], 5))
        except NotImplementedError:
            print("not implemented yet")
        except ValueError as error:  # the model package is not installed
            print(error)
        '''),
        check("ch07.decode_q4_1_block", "decode_q4_1_block", 2),
    ])
