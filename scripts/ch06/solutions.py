"""Chapter 6 exercises (solutions notebook; `memwall exercises` makes the student copy)."""

from nbcells import check, code, exercise, md, notebook


def build():
    return notebook("06_batching_solutions", [
        md("""
        # Exercises 6: batching

        Four pieces of chapter 6, written by you. Each comes with a widget that draws your function next to
        memwall's; until you fill it in, the widget says "not implemented yet". The check cell under each
        exercise tests your function on hidden random cases.
        """),
        code("""
        import math
        import random
        """),
        md("""
        ## Exercise 1: the batch size at which decode becomes compute-bound

        A decode step for `batch` sequences does about `2 × n_params` FLOPs per sequence. It reads the weights
        once (`n_params × bytes_per_param` bytes) and the KV cache of every sequence
        (`batch × context × kv_bytes_per_token` bytes). Its arithmetic intensity is FLOPs divided by bytes.

        Return the **smallest batch size** whose intensity reaches `ridge_point` (FLOPs per byte). If no
        batch size is large enough, return `math.inf`. This happens because the KV cache grows with the batch
        just as the FLOPs do.
        """),
        exercise("ch06.compute_bound_batch", "intensity = 2 B N / (N b + B c kv); solve for B, or give up when B -> infinity stays below the ridge", '''
        def compute_bound_batch(ridge_point, context, n_params, bytes_per_param,
                                kv_bytes_per_token):
            """Smallest batch whose decode step reaches the ridge point,
            or math.inf if none does."""
            ### BEGIN SOLUTION
            def intensity(batch):
                return 2 * batch * n_params / (n_params * bytes_per_param
                                               + batch * context * kv_bytes_per_token)

            if 2 * n_params <= ridge_point * context * kv_bytes_per_token:
                return math.inf  # the limit of the intensity as batch grows is below the ridge
            batch = max(1, math.ceil(ridge_point * n_params * bytes_per_param
                                     / (2 * n_params - ridge_point * context * kv_bytes_per_token)))
            while batch > 1 and intensity(batch - 1) >= ridge_point:
                batch -= 1
            while intensity(batch) < ridge_point:
                batch += 1
            return batch
            ### END SOLUTION
        '''),
        md("""
        The plot sweeps the context for Llama 3 8B (8.03 B parameters, 128 KiB of bf16 KV cache per token).
        The default ridge point is an H100's (about 295 FLOPs per byte). Where the curve leaves the plot,
        the answer is infinite: at that context no batch size makes decode compute-bound. Move the ridge down
        to a CPU's few FLOPs per byte, or shrink the KV cache, and see how the curve moves.
        """),
        code('''
        from memwall.grading.checks.ch06 import reference_compute_bound_batch
        from memwall.widgets import compare_plot

        compare_plot(compute_bound_batch, reference_compute_bound_batch,
                     x=("context", [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512]),
                     sliders={"ridge_point": [295.2, 153.0, 5.0, 2.5],
                              "n_params": [8.03e9, 1.24e9, 70.6e9],
                              "bytes_per_param": [2, 1, 0.5, 4],
                              "kv_bytes_per_token": [131072, 32768, 327680]},
                     logx=True, logy=True, xlabel="context (tokens per sequence)",
                     ylabel="smallest compute-bound batch")
        '''),
        check("ch06.compute_bound_batch", "compute_bound_batch", 2),
        md("""
        ## Exercise 2: the throughput curve, predicted from the ledger

        One decode step for `batch` sequences of `context` tokens moves `weight_bytes` plus
        `batch × context × kv_bytes_per_token` bytes and does `batch × flops_per_token` FLOPs. The roofline
        says it takes at least the larger of bytes ÷ `bandwidth` and FLOPs ÷ `peak_flops`. Return the
        **total tokens/s** this predicts: one token per sequence per step.
        """),
        exercise("ch06.predicted_throughput", "batch / max(bytes / bandwidth, flops / peak)", '''
        def predicted_throughput(batch, context, weight_bytes, kv_bytes_per_token, flops_per_token,
                                 bandwidth, peak_flops):
            """Upper bound on total tokens/s of batched decode."""
            ### BEGIN SOLUTION
            memory_s = (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth
            compute_s = batch * flops_per_token / peak_flops
            return batch / max(memory_s, compute_s)
            ### END SOLUTION
        '''),
        md("""
        The defaults are SmolLM2-135M in fp32 on a CPU like the course machine (about 20 GB/s and
        60 GFLOP/s). The curve rises with the batch until compute takes over, then flattens out. Pick an H100
        and Llama 3 8B in bf16 (16 GB, 128 KiB per token) to see the KV cache bend it first.
        """),
        code('''
        from memwall.grading.checks.ch06 import reference_predicted_throughput

        compare_plot(predicted_throughput, reference_predicted_throughput,
                     x=("batch", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]),
                     sliders={"context": [64, 1024, 8192], "weight_bytes": [538e6, 16.06e9],
                              "kv_bytes_per_token": [46080, 131072],
                              "flops_per_token": [268e6, 15e9],
                              "bandwidth": [20e9, 3.35e12], "peak_flops": [60e9, 989e12]},
                     logx=True, logy=True, xlabel="batch size", ylabel="total tokens/s (ceiling)")
        '''),
        check("ch06.predicted_throughput", "predicted_throughput", 2),
        md("""
        ## Exercise 3: a block-table allocator

        A paged KV cache has `n_blocks` blocks of `block_size` token slots each. `events` is a list of:

        - `("append", seq, tokens)`: sequence `seq` (new or not) grows by `tokens` tokens;
        - `("free", seq)`: sequence `seq` has finished, and its blocks go back to the free list.

        A sequence holds the fewest blocks that fit its tokens. It fills the room left in its last block
        before it takes a new one, and every new block is the **lowest-numbered free block**. Return the
        block tables of the sequences still alive at the end: `{seq: [block ids, in the order they were
        taken]}`. The events never need more than `n_blocks` blocks.
        """),
        exercise("ch06.block_tables", "track each sequence's length; take min(free) while blocks x block_size < length", '''
        def block_tables(events, n_blocks, block_size):
            """Replay appends and frees; return {seq: [block ids]} for live sequences."""
            ### BEGIN SOLUTION
            free = set(range(n_blocks))
            tables, lengths = {}, {}
            for event in events:
                if event[0] == "append":
                    _, seq, tokens = event
                    tables.setdefault(seq, [])
                    lengths[seq] = lengths.get(seq, 0) + tokens
                    while len(tables[seq]) * block_size < lengths[seq]:
                        block = min(free)
                        free.remove(block)
                        tables[seq].append(block)
                else:
                    free.update(tables.pop(event[1]))
                    del lengths[event[1]]
            return tables
            ### END SOLUTION
        '''),
        md("""
        The widget replays a random stream of 60 events (prompts, single decode tokens and finished
        sequences) and plots how many blocks are in use after each one. Try block size 1 and block size 16
        with the same seed.
        """),
        code('''
        from memwall.grading.checks.ch06 import blocks_in_use, random_events, reference_block_tables

        def in_use(allocator):
            def after(events_done, block_size, seed):
                events = random_events(random.Random(seed), 60, 24, block_size)
                return blocks_in_use(allocator, events[:events_done], 24, block_size)
            return after

        compare_plot(in_use(block_tables), in_use(reference_block_tables),
                     x=("events_done", list(range(0, 61, 2))),
                     sliders={"block_size": [4, 1, 2, 8, 16], "seed": (0, 20, 1, 0)},
                     xlabel="events replayed", ylabel="blocks in use (of 24)")
        '''),
        check("ch06.block_tables", "block_tables", 3),
        md("""
        ## Exercise 4: how much does paging waste?

        With paging, a sequence of `n` tokens holds `ceil(n / block_size)` blocks, so only the tail of its last
        block is empty. For the sequence lengths in `lengths`, return the **fraction of allocated slots that
        hold no token**: empty slots ÷ allocated slots, where every sequence has its own blocks.
        """),
        exercise("ch06.paged_waste", "allocated = sum of ceil(n / block_size) * block_size over sequences", '''
        def paged_waste(lengths, block_size):
            """Empty slots / allocated slots when each sequence rounds up to whole blocks."""
            ### BEGIN SOLUTION
            allocated = sum(math.ceil(n / block_size) * block_size for n in lengths)
            return (allocated - sum(lengths)) / allocated
            ### END SOLUTION
        '''),
        md("""
        The widget draws 32 sequence lengths around a typical length and sweeps the block size. Small blocks
        waste almost nothing, but every block is a table entry and a separate read for the attention kernel.
        vLLM uses 16 tokens per block by default.
        """),
        code('''
        from memwall.grading.checks.ch06 import reference_paged_waste

        def lengths_around(typical, seed=0):
            rng = random.Random(seed)
            return [max(1, int(rng.expovariate(1 / typical))) for _ in range(32)]

        compare_plot(lambda block_size, typical: paged_waste(lengths_around(typical), block_size),
                     lambda block_size, typical:
                         reference_paged_waste(lengths_around(typical), block_size),
                     x=("block_size", [1, 2, 4, 8, 16, 32, 64, 128, 256]),
                     sliders={"typical": [300, 30, 100, 1000, 4000]},
                     logx=True, xlabel="block size (tokens)",
                     ylabel="fraction of allocated slots empty")
        '''),
        check("ch06.paged_waste", "paged_waste", 1),
    ])
