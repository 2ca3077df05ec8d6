"""Chapter 6, second half: static vs continuous batching (simulated and real), the paged KV cache."""

from nbcells import code, md


def cells():
    return scheduling_cells() + paging_cells() + closing_cells()


def scheduling_cells():
    return [
        md("""
        ## Static against continuous batching

        So far the batch was a fixed set of sequences that start and stop together. Real requests arrive
        at random times and want answers of very different lengths: a yes/no answer, or a page of code.

        - **Static batching** takes up to B waiting requests, decodes until the *last* of them is done, then
          takes the next B. A request that finishes early leaves its slot idle. A request that arrives
          mid-batch waits for the slowest member of the current batch.
        - **Continuous batching**, also called iteration-level scheduling (Orca {cite}`yu2022orca`),
          decides who is in the batch at *every step*. A finished request leaves at once, and a waiting one
          joins at the next step, so the batch never drains while there is work.

        First a simulation, driven by the cost model, of Llama 3 8B in bf16 on an H100 serving a stream of
        requests. Arrivals are random (Poisson). Prompts run from tens to thousands of tokens. Answers are
        mostly short, with a long tail: 75% average 80 tokens, 25% average 600, and all are capped at 1024.
        Each step takes the cost model's floor for its batch and total context. A newly admitted request
        first pays for its prefill, during which the others wait, as in simple schedulers.
        """),
        code("""
        llama_weights, llama_kv = (cost.weight_bytes(llama, "bf16"),
                                   cost.kv_bytes_per_token(llama, "bf16"))
        flops_per_token = 2 * cost.matmul_params_per_token(llama)
        # per attended position
        attention_flops = 4 * llama.n_layers * llama.n_heads * llama.head_dim
        activation_bytes = 2 * cost.activation_elements_per_token(llama)
        BANDWIDTH, PEAK = h100.memory_bandwidth, cost.peak_flops(h100, "bf16")

        def step_seconds(new_tokens, attended, cached):
            # the roofline floor of one step: weights once,
            # the cache it reads, the FLOPs of its tokens
            moved = llama_weights + cached * llama_kv + new_tokens * activation_bytes
            return max(moved / BANDWIDTH,
                       (new_tokens * flops_per_token + attended * attention_flops) / PEAK)

        check = cost.step(llama, batch=8, context=999, weight_dtype="bf16")
        assert math.isclose(step_seconds(8, 8 * 1000, 8 * 1000),
                            cost.step_time_lower_bound(check, h100))

        def decode_seconds(batch, total_context):
            return step_seconds(batch, total_context + batch, total_context + batch)

        def prefill_seconds(prompt):
            return step_seconds(prompt, prompt * (prompt + 1) // 2, prompt)

        def make_stream(n, rate, seed=0, max_new=1024):
            rng = np.random.default_rng(seed)
            arrivals = np.cumsum(rng.exponential(1 / rate, n))
            prompts = np.clip(rng.lognormal(np.log(400), 0.8, n), 16, 4000).astype(int)
            outputs = np.where(rng.random(n) < 0.25, rng.geometric(1 / 600, n),
                               rng.geometric(1 / 80, n))
            return arrivals, prompts, np.clip(outputs, 1, max_new), max_new

        def simulate(stream, policy, max_batch=64, block_size=16):
            arrivals, prompts, outputs, max_new = stream
            n, now, arrived = len(arrivals), 0.0, 0
            waiting, running = deque(), []        # running: [request, context, tokens generated]
            admitted, finished = np.zeros(n), np.zeros(n)
            # per step: tokens held, paged slots, max-length reservation, requests running
            memory = []
            while arrived < n or waiting or running:
                while arrived < n and arrivals[arrived] <= now:
                    waiting.append(arrived)
                    arrived += 1
                if not waiting and not running:
                    now = arrivals[arrived]       # idle until the next request
                    continue
                # static: only when the batch has drained
                if policy == "continuous" or not running:
                    while waiting and len(running) < max_batch:
                        i = waiting.popleft()
                        now += prefill_seconds(prompts[i])  # yields the request's first token
                        admitted[i] = now
                        running.append([i, prompts[i], 1])
                total_context = sum(r[1] for r in running)
                memory.append((total_context,
                               sum(-(-r[1] // block_size) * block_size for r in running),
                               sum(prompts[r[0]] + max_new for r in running), len(running)))
                now += decode_seconds(len(running), total_context)
                for r in running:
                    r[1], r[2] = r[1] + 1, r[2] + 1
                    if r[2] >= outputs[r[0]]:
                        finished[r[0]] = now
                running = [r for r in running if r[2] < outputs[r[0]]]
            return {"tokens_per_s": outputs.sum() / (finished.max() - arrivals[0]),
                    "mean_wait_s": float(np.mean(admitted - arrivals)),
                    "p90_wait_s": float(np.percentile(admitted - arrivals, 90)),
                    "mean_latency_s": float(np.mean(finished - arrivals)),
                    "memory": np.array(memory)}

        RATES = [2, 4, 8, 16, 32, 64]
        simulated = {policy: [simulate(make_stream(300, rate), policy) for rate in RATES]
                     for policy in ("static", "continuous")}
        rows = ["| requests/s | static tok/s | continuous tok/s | static mean wait "
                "| continuous mean wait | static p90 wait | continuous p90 wait |",
                "|---:|---:|---:|---:|---:|---:|---:|"]
        for k, rate in enumerate(RATES):
            s, c = simulated["static"][k], simulated["continuous"][k]
            rows.append(f"| {rate} | {s['tokens_per_s']:,.0f} | "
                        f"{c['tokens_per_s']:,.0f} | {s['mean_wait_s']:.2f} s "
                        f"| {c['mean_wait_s']:.2f} s | "
                        f"{s['p90_wait_s']:.2f} s | {c['p90_wait_s']:.2f} s |")
        display(Markdown("Simulated: Llama 3 8B bf16 on an H100, "
                         "at most 64 requests per batch, 300 requests\\n\\n" + "\\n".join(rows)))
        """),
        code("""
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for policy, style in [("static", "o--"), ("continuous", "o-")]:
            left.plot(RATES, [r["tokens_per_s"] for r in simulated[policy]], style, label=policy)
            right.plot(RATES, [r["mean_wait_s"] for r in simulated[policy]], style,
                       label=f"{policy}, mean")
            right.plot(RATES, [r["p90_wait_s"] for r in simulated[policy]], style, alpha=0.4,
                       label=f"{policy}, p90")
        left.set(xscale="log", yscale="log", xlabel="arrival rate (requests/s)",
                 ylabel="tokens/s delivered",
                 title="Throughput")
        right.set(xscale="log", yscale="log", xlabel="arrival rate (requests/s)",
                  ylabel="queueing delay (s)",
                  title="Time from arrival to first token")
        for ax in (left, right):
            ax.set_xticks(RATES, [str(r) for r in RATES])
            ax.legend(fontsize=8)
        plt.show()
        """),
        md("""
        At low load both policies deliver what arrives. The difference is the wait. Under static batching
        a new request waits for the current batch's longest answer, which is hundreds of steps whenever one
        member drew a long reply. Under continuous batching it waits for one step plus the prefills ahead of
        it. As the load rises, static batching saturates early: its batches are full at the start and
        nearly empty at the end, so it pays for whole weight reads that serve a handful of long requests. Continuous
        batching keeps the batch full, and its throughput keeps climbing until the batch limit or the KV
        bytes stop it. In the Orca paper, iteration-level scheduling together with "selective batching"
        (batching the non-attention operations of sequences of different lengths) gave 36.9× the
        throughput of NVIDIA's FasterTransformer at the same latency, for GPT-3 175B {cite}`yu2022orca`.

        ### A small real run with the engine

        memwall's `Scheduler` does continuous batching on SmolLM2 for real. Each step decodes one token for
        every running request. Requests that finish leave, and their KV blocks go back to the free list.
        Waiting requests are then admitted first come, first served, prefilled one at a time, and join the
        decode from the next step. Its `mode="static"` admits nobody until the batch has drained. Here are
        10 requests, arriving one every two steps, with a batch of at most 4. Their prompts are snippets of
        4 to 40 tokens. Each answer stops at the end of its first sentence or line, so the lengths are
        mixed, as a server would see them:
        """),
        code("""
        source = tokenizer(" ".join(texts) + " The history of computing is a history of "
                           "moving data. Processors became fast long before memory did, and "
                           "every generation of hardware since has added caches, wider buses "
                           "and new kinds of memory to keep the arithmetic units fed.").input_ids
        # Each answer ends at the end of its first sentence
        # or line (or at 48 tokens, the cap a server
        # would reserve for), so the model itself decides how long each request runs.
        stops = (*tokenizer(".\\n").input_ids, tokenizer.eos_token_id)
        rng = random.Random(0)
        requests = []
        for i in range(10):
            length = rng.randint(4, 40)
            start = rng.randint(0, len(source) - length)
            requests.append(Request(i, source[start:start + length], 48, arrival_step=2 * i,
                                    stop_tokens=stops))

        real = {}
        for mode in ("static", "continuous"):
            scheduler = Scheduler(model, n_blocks=64, block_size=16, max_batch=4, mode=mode)
            start = time.perf_counter()
            results = scheduler.run(requests)
            wall = time.perf_counter() - start
            # seconds at the end of each step
            step_end = np.cumsum(scheduler.step_times_s)
            step_start = np.concatenate([[0.0], step_end[:-1]])
            waits = [step_end[r.first_token_step] - step_start[r.arrival_step] for r in results]
            real[mode] = dict(results=results, scheduler=scheduler, wall=wall, waits=waits,
                              tokens=sum(len(r.tokens) for r in results))
        assert ([r.tokens for r in real["static"]["results"]]
                == [r.tokens for r in real["continuous"]["results"]])

        rows = ["| | scheduler steps | wall time | tokens | tokens/s "
                "| mean batch | mean wait to first token |", "|---|---:|---:|---:|---:|---:|---:|"]
        for mode, r in real.items():
            s = r["scheduler"]
            rows.append(f"| {mode} | {s.step_index} | {r['wall']:.1f} s "
                        f"| {r['tokens']} | {r['tokens'] / r['wall']:.1f} "
                        f"| {statistics.mean(s.batch_sizes):.2f} "
                        f"| {statistics.mean(r['waits']):.2f} s |")
        display(Markdown("SmolLM2-135M on this machine, 10 requests, "
                         "batch ≤ 4 (both modes produce identical tokens)\\n\\n" + "\\n".join(rows)))
        print("answer lengths:", [len(r.tokens) for r in real["continuous"]["results"]])
        for mode, r in real.items():
            sizes = r["scheduler"].batch_sizes
            # a scheduler step with nobody running only prefills newcomers (or idles)
            print(f"{mode}: {len(sizes)} of {r['scheduler'].step_index} scheduler steps "
                  f"decoded, mean batch {statistics.mean(sizes):.2f} of at most "
                  f"{r['scheduler'].max_batch}, largest {max(sizes)}, "
                  f"{sizes.count(1)} steps with a single request")

        fig, ax = plt.subplots(figsize=(8, 3))
        for mode, style in [("static", "--"), ("continuous", "-")]:
            ax.step(range(len(real[mode]["scheduler"].batch_sizes)),
                    real[mode]["scheduler"].batch_sizes, style,
                    where="post", label=mode)
        ax.set(xlabel="decode step", ylabel="requests decoding", title="Batch occupancy, real run")
        ax.legend()
        plt.show()
        """),
        md("""
        Both runs produce the same tokens for every request. They differ in when a waiting request may join.
        Under static batching a batch takes only the requests that have arrived when it starts, and nobody
        else until its longest answer is done. One long answer then decodes in a nearly empty batch, while
        the requests that arrive meanwhile queue behind it. Under continuous batching a waiting request joins
        at the next step, so the batch holds every request that has arrived and not finished, up to the
        limit. The lines under the table give each mode's mean and largest batch, and how many steps decoded
        a single request. They count only the steps that decoded: a scheduler step with no request running
        (the first one, for instance) only prefills newcomers, so the table's step count can be higher. How full even the continuous batch gets depends on the stream. Many answers here
        are short (their lengths are printed above), and an answer that ends with its first token finishes
        in its prefill and never joins a decode step. The batch can only be as full as the arrivals keep it.
        The table gives this run's throughput and waiting times.
        """),
    ]


def paging_cells():
    return [
        md("""
        ## The paged KV cache: block tables and fragmentation

        Continuous batching needs a cache that sequences can join and leave at any step, each growing at
        its own pace. The simple answer gives each request a contiguous region big enough for its prompt
        plus `max_new_tokens`, reserved when it is admitted. Most of that region is empty most of the time.
        The tokens are not generated yet, many requests stop long before the cap, and the free space left
        between regions may be too small for the next request. Kwon et al. measured existing serving
        systems and found that only about 20% to 38% of their KV memory held actual tokens {cite}`kwon2023vllm`.

        **PagedAttention** manages KV memory as an operating system manages RAM. The cache is cut into
        **blocks** of a fixed number of token slots. Each sequence owns a **block table**, a list of block
        numbers that need not be adjacent, like a page table. New blocks come from a **free list**, one
        at a time, as the sequence grows. A sequence then wastes at most the unused tail of its last block.
        A finished sequence returns its blocks at once, and any sequence can use them. Here is the whole
        allocator in a few lines, replayed on a few events and compared with memwall's `BlockManager`:
        """),
        code("""
        def replay(events, n_blocks, block_size):
            free = list(range(n_blocks))[::-1]     # a stack: take from the end
            tables, lengths = {}, {}
            for kind, seq, tokens in events:
                if kind == "free":
                    free.extend(reversed(tables.pop(seq)))
                    del lengths[seq]
                    continue
                tables.setdefault(seq, [])
                lengths[seq] = lengths.get(seq, 0) + tokens
                while len(tables[seq]) * block_size < lengths[seq]:
                    tables[seq].append(free.pop())
            return tables

        events = [("append", "A", 6), ("append", "B", 3), ("append", "C", 9), ("append", "A", 1),
                  ("append", "B", 2),
                  ("free", "B", 0), ("append", "D", 7), ("append", "A", 2), ("append", "C", 1)]
        ours = replay(events, n_blocks=12, block_size=4)

        manager = BlockManager(n_blocks=12, block_size=4)
        for kind, seq, tokens in events:
            if kind == "free":
                manager.free(seq)
                continue
            if seq not in manager.tables:
                manager.add(seq)
            manager.reserve([seq], tokens)
            manager.advance(seq, tokens)
        assert ours == manager.tables
        print("block tables:", ours)
        use = manager.memory_use()
        print(f"{use.used_slots} tokens in {use.allocated_slots} allocated slots: "
              f"{use.wasted_slots} slots wasted")

        owner = np.full(12, -1)
        for k, seq in enumerate(sorted(ours)):
            owner[ours[seq]] = k
        fig, ax = plt.subplots(figsize=(8, 1.3))
        ax.imshow(owner[None], cmap="tab10", vmin=-1, vmax=9, aspect="auto")
        for block, k in enumerate(owner):
            ax.text(block, 0, sorted(ours)[k] if k >= 0 else "free", ha="center", va="center",
                    color="white" if k >= 0 else "black")
        ax.set(yticks=[], xticks=range(12), xlabel="block number",
               title="Who owns each block (D took B's freed blocks)")
        plt.show()
        """),
        md("""
        Sequence D took the blocks B gave back, and its table is not contiguous. Nothing needs it to be,
        because attention looks each position up through the table. memwall's `PagedKVCache` keeps one pool
        of token slots per layer and the block manager above it. The model writes through the block tables
        in `update(layer, k, v)`, with the same interface as the contiguous `KVCache`. The scheduler above
        ran on it, and `tests/test_paged_cache.py` checks that its outputs equal the contiguous cache's. One
        difference from vLLM: a real PagedAttention kernel reads the blocks in place, while plain PyTorch
        has no such kernel, so memwall gathers each sequence's blocks into a dense tensor first. That is one
        more copy of the batch's KV bytes per layer, which a fused kernel would avoid.

        ### How much does paging save? Measured

        The real scheduler run recorded, after every step, the tokens held, the slots its block tables held,
        and what reserving `prompt + max_new_tokens` per request would have held. The simulated stream
        recorded the same for its thousands of steps (blocks of 16 tokens):
        """),
        code("""
        def waste(memory):
            held, paged, reserved = (np.asarray(column, dtype=float) for column in memory[:3])
            busy = held > 0
            return (1 - held[busy].sum() / paged[busy].sum(),
                    1 - held[busy].sum() / reserved[busy].sum())

        run = real["continuous"]["scheduler"]
        real_memory = ([m.used_slots for m in run.memory], [m.allocated_slots for m in run.memory],
                       run.reserved_if_contiguous)
        sim = simulated["continuous"][RATES.index(16)]["memory"].T
        rows = ["| | block size | paged: slots empty | max-length reservation: slots empty |",
                "|---|---:|---:|---:|"]
        for label, memory, block in [("real run, SmolLM2 (10 requests)", real_memory,
                                      run.cache.blocks.block_size),
                                     ("simulated stream, Llama 3 8B at 16 requests/s", sim, 16)]:
            paged_waste, reserved_waste = waste(memory)
            rows.append(f"| {label} | {block} | {paged_waste:.1%} | {reserved_waste:.1%} |")
        display(Markdown("\\n".join(rows)))

        held, paged, reserved, running = sim
        kv_slots = ((h100.memory_bytes - cost.weight_storage_bytes(llama, "bf16"))
                    / cost.kv_bytes_per_token(llama, "bf16"))
        print(f"an H100 has room for {kv_slots:,.0f} KV token slots next to Llama 3 8B's weights; "
              "per running request "
              f"the stream used {held.sum() / running.sum():,.0f} tokens, "
              f"{paged.sum() / running.sum():,.0f} paged slots "
              f"or {reserved.sum() / running.sum():,.0f} reserved slots")
        print("concurrent requests that fit: "
              f"{kv_slots * running.sum() / paged.sum():,.0f} with paging, "
              f"{kv_slots * running.sum() / reserved.sum():,.0f} with max-length reservation")
        """),
        md("""
        Paging leaves only the tails of last blocks empty. Reserving each request's maximum leaves empty
        everything between a request's length and its cap, from the first step: tokens not generated yet,
        and tokens that will never be generated because the answer stops early. In the simulated stream,
        with a 1024-token cap and answers of a few hundred tokens, that is a large share of the reservation. In the
        small real run the sequences are only a few dozen tokens long, so a 16-token block is a large tail
        by comparison. Its figures are this run's, and they show the same ordering at a smaller scale. The
        memory saved becomes batch size: in the same KV memory, paging fits more concurrent requests, as
        the last line above computes for the simulated stream. This is where
        vLLM's throughput gain over systems that reserve comes from {cite}`kwon2023vllm`. The block size is
        a trade-off. Smaller blocks waste less, but mean longer tables and more, smaller reads for the
        attention kernel. Exercise 4 lets you sweep it.
        """),
    ]


def closing_cells():
    return [
        md("""
        ## What to remember

        - **Batching reads the weights once for B users.** While decode is memory-bound, and on hardware
          whose kernels stream the weights as fast for a few rows as for one, total throughput grows
          almost B-fold and each user's time per token barely moves; the measured table
          shows whether this machine's do. Of the three levers, batching is
          "more tokens per weight read", not fewer bytes.
        - **The ridge point sets where that stops.** Past it, extra users pay for their own FLOPs. An H100
          (about 295 FLOPs per byte in bf16, from its datasheet) needs hundreds of concurrent sequences to
          get there. A CPU, whose ridge point is far lower, gets there with the much smaller B printed in the
          ridge-point section. Where that B is below 16, B = 16 cannot give 16× the tokens/s of B = 1.
        - **The KV cache takes over at long context × large batch** {cite}`pope2022efficiently`. Once
          B × context × KV bytes per token passes the weight bytes, each user brings their own memory bill,
          and past a certain context no batch size makes decode compute-bound. GQA and MQA push that point
          further out.
        - **Padding or ragged:** sequences of different lengths share a batch through positions and a mask
          (left padding) or through per-sequence lengths (a ragged, paged layout). Either way, each
          sequence's output is exactly what it would be alone.
        - **Continuous batching** schedules every step: finished requests leave, and waiting ones join
          without draining the batch. Compared with static batching it cuts the time to first token
          and keeps the batch, and so the weight reads, full {cite}`yu2022orca`.
        - **Paged KV cache:** fixed-size blocks, a block table per sequence and a free list. Memory is wasted
          only in the last block of each sequence, instead of everything reserved for tokens that may never
          come, and the memory saved becomes batch size {cite}`kwon2023vllm`.

        ## Exercises

        Open [exercises/06_batching.ipynb](../exercises/06_batching.ipynb). You will find the batch size at
        which decode becomes compute-bound, predict the throughput curve from the ledger, write a block-table
        allocator with a free list, and measure how much paging wastes as the block size changes.
        """),
    ]
