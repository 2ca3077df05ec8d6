"""Chapter 9, second half: serving under load, open questions, and what to remember."""

from nbcells import code, md


def serving_cells():
    return [
        md("""
        ## Measuring a real serving engine

        On one machine we time the engine directly. A deployment is a server: vLLM, SGLang, the llama.cpp
        server, or a hosted API, all of which speak the OpenAI-compatible HTTP protocol with streaming. The same
        method applies: stream the tokens, take TTFT as the time to the first streamed token and TPOT as the
        gaps between later ones, repeat, and report medians and tails, now at a stated *concurrency*.

        `memwall bench serve --url URL --concurrency N` does this against any such endpoint, bounded in both
        requests and seconds. Here we point it at memwall's own small server (`memwall serve`), started in this
        notebook on 127.0.0.1. It runs one request at a time, as a server without batching would, so the
        waiting shows up in TTFT when two clients share it.
        """),
        code("""
        from memwall.serving.load import run_load
        from memwall.serving.server import start_server

        server = start_server(model, tokenizer, "smollm2-135m")
        url = f"http://127.0.0.1:{server.server_port}"
        load_results = {c: run_load(url, concurrency=c, requests=4, max_tokens=8, duration_s=120)
                        for c in (1, 2)}
        server.shutdown()
        print(f"{'concurrency':>11} {'ok':>4} {'TTFT median':>12} "
              f"{'TTFT p90':>9} {'TPOT median':>12} {'tok/s':>6}")
        for c, r in load_results.items():
            print(f"{c:>11} {r['succeeded']:>4} {r['ttft']['median_ms']:>9.0f} "
                  f"ms {r['ttft']['p90_ms']:>6.0f} ms "
                  f"{r['tpot']['median_ms']:>9.1f} ms {r['throughput_tok_per_s']:>6.1f}")
        print("TTFT median rose "
              f"{load_results[2]['ttft']['median_ms'] / load_results[1]['ttft']['median_ms']:.1f}x "
              "when two clients shared the unbatched server")
        """),
    ]


def open_question_cells():
    return [
        md("""
        ## What is unsettled

        ### Prefill and decode on the same chips

        A real server mixes the two phases: a new request's prefill runs on the same hardware as the decode
        steps of everyone already generating. A long prefill is compute-heavy; while it runs, every decoding
        user waits, and their TPOT spikes. Measure it with our engine: the decode steps of one user, with
        another user's 512-token prefill slipped in between two of them.
        """),
        code("""
        other_cache = model.new_cache(max_tokens=600)
        cache = model.new_cache(max_tokens=200)
        token = prefill(model, torch.tensor([prompt]), cache).argmax(-1)
        gaps = []
        for step in range(12):
            start = time.perf_counter()
            if step == 6:   # another request arrives: its prefill runs before our next step
                prefill(model, torch.randint(0, 1000, (1, 512)), other_cache)
            token = decode_step(model, token, cache).argmax(-1)
            gaps.append((time.perf_counter() - start) * 1e3)
        quiet = statistics.median(gaps[:6] + gaps[7:])
        print(f"token gaps (ms): {' '.join(f'{g:.0f}' for g in gaps)}")
        print(f"a 512-token prefill turned one {quiet:.0f} ms "
              f"gap into {gaps[6]:.0f} ms ({gaps[6] / quiet:.0f}x)")
        """),
        md("""
        Schedulers answer this by splitting prefills into chunks that ride along with decode steps
        (chunked prefill, {cite}`agrawal2024sarathi`) or by running prefill and decode on different machines and
        shipping the KV cache between them (disaggregated prefill, {cite}`zhong2024distserve`;
        {cite}`patel2024splitwise`). Which wins depends on the traffic mix and the interconnect; it is an active
        area.

        ### Mixture of experts

        A mixture-of-experts model {cite}`jiang2024mixtral` stores many feed-forward "experts" per layer but
        routes each token through only a few. For one token, only the active experts' weights are read, so the
        bytes per step, and the decode ceiling, follow the *active* parameters. But a batch of tokens routed to
        different experts touches more of them: at a large batch, every expert is read every step, and the
        advantage over a dense model of the same total size fades.
        """),
        code("""
        from memwall import specs
        mixtral = specs.get_spec("mixtral-8x7b")
        h100 = hardware.get_hardware("h100-sxm")
        print(f"Mixtral 8x7B: {mixtral.n_params / 1e9:.1f}B parameters in total, "
              f"{mixtral.n_params_active / 1e9:.1f}B active per token "
              f"({mixtral.n_active_experts} of {mixtral.n_experts} experts)")
        for batch in (1, 2, 4, 8, 32):
            touched = cost.expected_experts_touched(mixtral, batch)
            weights = cost.weight_bytes(mixtral, "bf16", tokens=batch)
            step_s = weights / h100.memory_bandwidth
            print(f"batch {batch:>2}: "
                  f"{touched:.2f} of {mixtral.n_experts} experts read per layer on average, "
                  f"{weights / 1e9:5.1f} GB of bf16 weights per step, "
                  f">= {step_s * 1e3:4.1f} ms on an H100 SXM")
        """),
        md("""
        ### Very low-bit formats

        Chapter 7 went down to 4 bits. Research formats go further, to about 2 bits per weight and to ternary
        weights of about 1.58 bits {cite}`ma2024era`. The cost model shows the ceiling such formats promise for a
        Llama-3-8B-shaped model at 100 GB/s; whether quality survives, and whether the unpacking work stays
        cheaper than the bytes it saves, is exactly what chapter 7 taught you to measure before believing.
        """),
        code("""
        llama = specs.get_spec("llama-3-8b")
        laptop = hardware.get_hardware("laptop-100gbs")
        for label, bits in (("bf16", 16), ("int8", 8), ("int4", 4), ("2-bit", 2),
                            ("ternary", 1.58)):
            weights = cost.weight_bytes_for_params(llama.n_params, "bf16") * bits / 16
            print(f"{label:>8}: {weights / 1e9:5.2f} GB per step -> at most "
                  f"{cost.bandwidth_bound_tokens_per_s(weights, laptop):6.1f} tok/s at 100 GB/s")
        """),
        md("""
        ## What to remember

        - Warm up, repeat, and report medians with the spread; quote ratios measured side by side in one run.
        - Say which memory a number measures: a working set that fits in cache is not the memory wall.
        - On a GPU, synchronise before reading the clock.
        - Report TTFT, TPOT and throughput together, with batch size, context and concurrency.
        - For every technique, name the bytes it reduces (weights, KV cache, or tokens per weight read) and
          compare its speed with the roofline for *those* bytes. Expect to land below the ceiling; a
          result above it means the ceiling was measured low.
        - The open questions (mixing prefill with decode, experts, very low bits) are questions about the
          same three costs.

        The exercises for this chapter are in [exercises/09_measuring.ipynb](../exercises/09_measuring.ipynb).
        """),
    ]
