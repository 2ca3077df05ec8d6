"""Chapter 7, first half: bytes per weight, int8 and int4 by hand, GGUF Q4_1 decoded by hand."""

from nbcells import code, md


def cells():
    return [
        md(r"""
        # 7. Quantization

        Chapter 3 gave the rule for one user: every decode step reads every weight once, so
        tokens/s $\le$ bandwidth / bytes per step, and at short context those bytes are almost all weights.
        Of the three things an optimisation can reduce (weight bytes, KV-cache bytes, or how many tokens
        each weight read produces), **weight-only quantization** goes after the first: store each weight in
        fewer bits. The arithmetic still happens in floating point. Each weight is turned back into a float
        ("dequantized") on its way into the multiply, so the activations never leave floating point.

        Fewer bytes raise the ceiling. Whether the measured speed follows depends on two things: the
        kernel must read the small bytes directly, and the dequantizing work must cost less than the reads
        it saves. And every bit removed costs some quality. This chapter measures all three on
        SmolLM2-135M {cite}`allal2025smollm2`. At the end it does the same for the KV cache, the bytes
        that grow with context.
        """),
        code("""
        import collections, copy, statistics, time
        import matplotlib.pyplot as plt
        import numpy as np
        import torch
        from memwall import cost, gguf_q4, models, quality
        from memwall.engine import Transformer, cpu_kernels, decode_step, generate
        from memwall.engine.kv_quant import KVCacheInt8
        from memwall.engine.quant import (Int4Linear, dequantize_int8, pack_int4, quantize,
                                          quantize_int8)
        from memwall.hardware import measure

        torch.manual_seed(0);  # the semicolon hides the returned Generator
        spec = "smollm2-135m"
        """),
        md(r"""
        ## Bytes per weight, and the ceiling they set

        The formats in this chapter:

        - **fp32, bf16**: plain floats, 32 and 16 bits.
        - **int8, per output channel**: an 8-bit integer code per weight and one scale per output row. The
          scale is shared by the row's 576 or more weights, so it adds less than 0.03 bits per weight.
        - **int4, group-wise**: a 4-bit code per weight. Each group of $g$ consecutive weights in a row
          also stores a 16-bit scale and a 16-bit offset, which is $32/g$ extra bits per weight.
        - **Q4_1**, the format of the GGUF file this course ships: blocks of 32 weights, each with 4-bit codes,
          an fp16 scale and an fp16 minimum.

        Here is each one in bits per weight, written out, and the decode ceiling it sets for SmolLM2-135M at
        this machine's measured bandwidth. Each line is checked against `memwall.cost`:
        """),
        code("""
        def bits_per_weight(code_bits, group_size=None, metadata_bits_per_group=0):
            \"\"\"Storage bits per weight: its code, plus its share of its group's metadata.\"\"\"
            return code_bits + (metadata_bits_per_group / group_size if group_size else 0)

        formats = {  # name: (bits per weight, the cost model's name for the format)
            "fp32": (bits_per_weight(32), "fp32"),
            "bf16": (bits_per_weight(16), "bf16"),
            "int8": (bits_per_weight(8), "int8"),
            "int4-g128": (bits_per_weight(4, 128, 16 + 16), "int4-g128"),
            "int4-g64": (bits_per_weight(4, 64, 16 + 16), "int4-g64"),
            "int4-g32": (bits_per_weight(4, 32, 16 + 16), "int4-g32"),
            "Q4_1": (bits_per_weight(4, 32, 16 + 16), "q4_1"),
        }
        bandwidth = measure().bandwidth
        print(f"measured memory bandwidth: {bandwidth / 1e9:.1f} GB/s")
        print(f"{'format':<10} {'bits/weight':>11} {'weights of SmolLM2-135M':>24} {'ceiling':>13}")
        for name, (bits, dtype) in formats.items():
            assert bits / 8 == cost.bytes_per_element(dtype), name
            weight_bytes = cost.weight_bytes(spec, dtype)
            print(f"{name:<10} {bits:>11.3g} {weight_bytes / 1e6:>21.0f} "
                  f"MB {bandwidth / weight_bytes:>7.0f} tok/s")
        """),
        md(r"""
        Q4_1 and int4-g32 have the same shape: 4 bits plus two 16-bit numbers per 32 weights, which is 5 bits.
        From fp32 to 5 bits the bytes shrink 6.4×, and the ceiling rises by the same factor. A ceiling is an
        upper bound, so we will measure how much of it each format reaches.

        ## int8 with one scale per output channel

        The simplest scheme is symmetric **absmax**. Each row gets a scale $s = \max|w_\text{row}| / 127$,
        each weight becomes $q = \operatorname{round}(w/s) \in [-127, 127]$, and the matmul uses $q\,s$. The
        rounding error is at most half a step, $s/2$. Here it is on a real matrix, the fused gate and up
        projections of layer 0:
        """),
        code("""
        hf_model, tokenizer = models.load(spec)
        fp32_model = Transformer.from_hf(hf_model)
        del hf_model  # the engine has its own copy of the weights
        # [3072, 576]: gate rows, then up rows
        W = fp32_model.blocks[0].mlp.gate_up.weight

        def int8_per_channel(w):
            scale = w.abs().amax(dim=1, keepdim=True) / 127
            codes = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
            return codes, scale

        def relative_rms(error, w):
            return (error.pow(2).mean().sqrt() / w.pow(2).mean().sqrt()).item()

        codes8, scale8 = int8_per_channel(W)
        error = codes8.float() * scale8 - W
        print(f"W {tuple(W.shape)}: "
              f"{W.nbytes / 1e6:.2f} MB in fp32 -> {codes8.nbytes / 1e6:.2f} MB of codes "
              f"+ {scale8.numel() * 2 / 1e3:.1f} kB of 16-bit scales")
        print(f"worst error / half a step: {(error.abs() / (scale8 / 2)).max():.3f};  "
              f"relative RMS error: {relative_rms(error, W):.3%}")
        mw_codes, mw_scales = quantize_int8(W)
        print(f"memwall's quantize_int8 (scales stored in bf16): relative RMS error "
              f"{relative_rms(dequantize_int8(mw_codes, mw_scales) - W, W):.3%}")
        """),
        md(r"""
        Under 1% relative error. Large models make int8 harder than this: Dettmers et al. found that
        from about 6.7B parameters on, a few hidden dimensions carry activations about 100× larger than
        the rest, and rounding those *activations* to int8 breaks the model. LLM.int8() therefore
        multiplies those few dimensions in 16-bit {cite}`dettmers2022llmint8`. Weight-only quantization
        never rounds the activations, so for it the only question is the weights' own range, and a scale per
        row handles that.

        ## int4 in groups, two codes per byte

        Four bits give only 16 levels. With one scale per row, a single large weight would stretch the
        levels of all 576 others. So int4 formats give each **group** of $g$ consecutive weights its own
        range. The group's $[\min, \max]$ is mapped onto the codes 0…15: $w \approx \min + q \cdot
        \text{step}$, with $\text{step} = (\max - \min)/15$. A byte then holds two codes.

        GPTQ {cite}`frantar2022gptq` and AWQ {cite}`lin2023awq` store exactly this kind of data: codes,
        plus a scale and a zero per group. They choose the codes better than rounding to the nearest level,
        as we do here. GPTQ uses second-order information from calibration data to make later weights
        absorb the rounding error of earlier ones. AWQ first rescales the input channels that carry large
        activations, so that their weights lose less. The bytes are the same; the quality is better.
        """),
        code("""
        def int4_groupwise(w, group_size):
            rows, cols = w.shape
            groups = w.reshape(rows, cols // group_size, group_size)
            low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
            step = (high - low) / 15
            codes = torch.round((groups - low) / step).clamp(0, 15)
            return codes.reshape(rows, cols).to(torch.uint8), step, low

        def dequantize_groupwise(codes, step, low):
            rows, cols = codes.shape
            return (codes.float().reshape(rows, step.shape[1], -1) * step + low).reshape(rows, cols)

        def pack_pairs(codes):
            # even column in the low nibble, odd in the high
            return codes[:, 0::2] | (codes[:, 1::2] << 4)

        codes4, step4, low4 = int4_groupwise(W, 64)
        packed = pack_pairs(codes4)
        stored = packed.nbytes + step4.numel() * 2 + low4.numel() * 2  # 16-bit step and minimum
        print(f"codes {tuple(codes4.shape)} -> packed {tuple(packed.shape)} {packed.dtype}: "
              f"{stored / 1e6:.3f} MB = {stored * 8 / W.numel():.3f} bits per weight")
        print(f"first byte {packed[0, 0].item():#04x}: "
              f"code {codes4[0, 0].item()} in the low nibble, "
              f"code {codes4[0, 1].item()} in the high one")
        print("identical to memwall's pack_int4:", torch.equal(packed, pack_int4(codes4)))
        """),
        md(r"""
        Smaller groups cost more bits and follow the weights more closely. Here is the error against the
        group size, from $g = 32$ up to one group per row ($g = 576$), on the layer-0 matrix and on the
        output head:
        """),
        code("""
        head = fp32_model.lm_head.weight  # [49152, 576], tied to the token embedding
        print(f"{'group size':>10} {'bits/weight':>11} {'layer-0 gate/up':>16} {'output head':>12}")
        for g in (32, 64, 192, 576):
            errors = []
            for w in (W, head):
                c, s, lo = int4_groupwise(w, g)
                errors.append(relative_rms(dequantize_groupwise(c, s, lo) - w, w))
            print(f"{g:>10} {bits_per_weight(4, g, 32):>11.3f} "
                  f"{errors[0]:>16.2%} {errors[1]:>12.2%}")
        """),
        md(r"""
        At $g = 32$ the layer-0 error is zero, to float precision. That is not luck, and the next
        section shows why.

        ## GGUF Q4_1, decoded by hand

        The model we load offline comes from one file, `SmolLM2-135M-Instruct.Q4_1.gguf`. GGUF
        {cite}`ggml2023gguf` is the file format of ggml and llama.cpp: a header, key/value metadata, a
        directory of tensors (name, shape, type, offset), and then the tensor bytes, aligned.
        `memwall.gguf_q4` reads the directory with `struct`, in about 60 lines. Each Q4_1 tensor is a run
        of 20-byte blocks, one per 32 consecutive weights of a row:

        | bytes | content |
        |---|---|
        | 0–1 | $d$, fp16: the step between codes |
        | 2–3 | $m$, fp16: the block's minimum |
        | 4–19 | 32 codes $q$ of 4 bits: byte $i$ holds weight $i$ in its low nibble and weight $i + 16$ in its high nibble |

        Each weight is $x = d\,q + m$.
        """),
        code("""
        path = models.gguf_path()
        metadata, tensors = gguf_q4.read_directory(path)
        kinds = collections.Counter(t.type_name for t in tensors.values())
        print(f"{path.name}: {len(tensors)} tensors, {dict(kinds)}")
        print("the token embedding, which is also the output head:",
              tensors["token_embd.weight"].type_name)
        info = tensors["blk.0.ffn_gate.weight"]
        print(f"{info.name}: {info.type_name}, shape {info.shape}, {info.n_bytes:,} bytes = "
              f"{info.n_bytes * 8 / np.prod(info.shape):.2f} bits per weight")
        """),
        md("Now decode the first block of that tensor by hand, as numpy bytes:"),
        code("""
        block = np.array(gguf_q4.raw_bytes(path, info)[:20])
        print("the first block's 20 bytes:", block.tobytes().hex(" "))
        d = block[0:2].view(np.float16)[0]
        m = block[2:4].view(np.float16)[0]
        nibbles = block[4:20]
        # weights 0-15 in low nibbles, 16-31 in high ones
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4])
        x = np.float32(d) * q.astype(np.float32) + np.float32(m)
        print(f"d = {d}, m = {m}")
        print("codes:  ", q.tolist())
        print("weights:", np.round(x[:6], 5).tolist(), "...")
        """),
        md(r"""
        Three checks. The same numbers come from the `gguf` package's own decoder, bit for bit. They are
        also the first 32 weights of the layer-0 gate projection in the fp32 model we have been using. And
        decoding every block of the tensor gives the same codes that our int4-g32 quantizer produced:
        """),
        code("""
        import gguf  # the reference implementation, installed with memwall

        reference = gguf.quants.dequantize(block, gguf.GGMLQuantizationType.Q4_1).reshape(-1)
        print("bit for bit equal to gguf.quants.dequantize:",
              np.array_equal(x.view(np.uint32), reference.view(np.uint32)))
        print("equal to the fp32 model's weights [0, :32]:", np.array_equal(x, W[0, :32].numpy()))

        blocks = np.array(gguf_q4.raw_bytes(path, info)).reshape(-1, 20)
        file_codes = np.concatenate([blocks[:, 4:] & 0x0F, blocks[:, 4:] >> 4],
                                    axis=1).reshape(info.shape)
        our_codes, _, _ = int4_groupwise(W[:info.shape[0]], 32)  # the gate half of gate/up
        ends_used = ((file_codes.reshape(-1, 32).min(1) == 0)
                     & (file_codes.reshape(-1, 32).max(1) == 15)).mean()
        print(f"blocks whose codes include both 0 and 15: {ends_used:.2%}")
        print("our int4-g32 codes equal to the file's Q4_1 codes: "
              f"{(our_codes.numpy() == file_codes).mean():.2%}")
        """),
        md(r"""
        So the "fp32" model is a Q4_1 model decoded to floats. transformers did that decoding when it loaded
        the file. Every group of 32 weights already sits on a grid of 16 levels, with its minimum at code 0 and
        its maximum at code 15. A round-to-nearest int4-g32 quantizer therefore lands on the very same grid
        and loses nothing except the rounding of the stored scale. Other group sizes cut across the file's
        blocks and do lose information. So does the output head, which the file stores in 8 bits (Q8_0).

        Keep this in mind when reading the quality figures below. They compare each format with the model
        **as shipped**, not with the original 16-bit checkpoint, which we do not have offline. On a model
        trained and shipped in bf16, int4-g32 would lose more than it does here.
        """),
    ]
