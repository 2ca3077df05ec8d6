"""Continuous batching: requests join and leave without draining, none is lost, outputs equal solo decoding."""

import pytest
import torch

from memwall.engine import generate
from memwall.engine.scheduler import Request, Scheduler


def stream(n=10, seed=0, max_prompt=20, max_new=24, every=2):
    """Requests arriving every `every` steps, with mixed prompt and output lengths."""
    g = torch.Generator().manual_seed(seed)
    requests = []
    for i in range(n):
        prompt = int(torch.randint(1, max_prompt, (1,), generator=g))
        new = int(torch.randint(1, max_new, (1,), generator=g))
        requests.append(
            Request(
                i,
                torch.randint(0, 256, (prompt,), generator=g).tolist(),
                new,
                arrival_step=i * every,
            )
        )
    return requests


def solo(model, request):
    return generate(
        model, request.prompt, request.max_new_tokens, stop_tokens=request.stop_tokens
    ).tokens


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_every_request_gets_its_solo_output(tiny_engine, mode):
    requests = stream()
    scheduler = Scheduler(tiny_engine, n_blocks=64, block_size=4, max_batch=4, mode=mode)
    results = scheduler.run(requests)
    assert [r.request_id for r in results] == [q.request_id for q in requests]
    for result, request in zip(results, requests):
        assert result.error is None
        assert result.tokens == solo(tiny_engine, request)
    assert scheduler.idle and scheduler.cache.blocks.n_free == 64  # every block came back
    assert max(scheduler.batch_sizes) <= 4


def test_finished_requests_leave_and_waiting_ones_join_without_draining(tiny_engine):
    # Two short requests and one long one fill a batch of 3; two more wait from step 0.
    requests = [
        Request("long", [1, 2, 3], 30),
        Request("short1", [4, 5], 3),
        Request("short2", [6], 4),
        Request("late1", [7, 8, 9], 5),
        Request("late2", [10], 5),
    ]
    scheduler = Scheduler(tiny_engine, n_blocks=64, block_size=4, max_batch=3)
    results = {r.request_id: r for r in scheduler.run(requests)}
    # The late requests start as soon as a short one leaves, long before the long one finishes...
    assert results["late1"].first_token_step == results["short1"].finish_step
    assert results["late2"].first_token_step == results["short2"].finish_step
    assert results["late2"].finish_step < results["long"].finish_step
    # ...and the batch never drained while work was waiting.
    assert scheduler.batch_sizes[:6] == [3] * 6 and scheduler.batch_sizes[6] == 2


def test_static_batching_waits_for_the_whole_batch(tiny_engine):
    requests = [
        Request("long", [1, 2, 3], 12),
        Request("short", [4, 5], 2),
        Request("late", [7, 8], 3),
    ]
    scheduler = Scheduler(tiny_engine, n_blocks=64, block_size=4, max_batch=2, mode="static")
    results = {r.request_id: r for r in scheduler.run(requests)}
    assert (
        results["late"].first_token_step
        == results["long"].finish_step
        > results["short"].finish_step
    )


def test_impossible_request_is_rejected_and_nothing_else_is_lost(tiny_engine):
    requests = stream(6, seed=1)
    requests.insert(3, Request("huge", [1] * 40, 30, arrival_step=3))  # 70 tokens > 16 blocks x 4
    scheduler = Scheduler(tiny_engine, n_blocks=16, block_size=4, max_batch=4)
    results = scheduler.run(requests)
    huge = results[3]
    assert huge.tokens == [] and "can never fit" in huge.error and "70 tokens" in huge.error
    for result, request in zip(results, requests):
        if request.request_id != "huge":
            assert result.error is None and result.tokens == solo(tiny_engine, request)


def test_submit_raises_a_clear_error(tiny_engine):
    scheduler = Scheduler(tiny_engine, n_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="can never fit.*4 blocks of 4"):
        scheduler.submit(Request("r", [1] * 10, 7))
    with pytest.raises(ValueError, match="empty"):
        scheduler.submit(Request("e", [], 3))
    scheduler.submit(Request("ok", [1, 2], 3))
    with pytest.raises(ValueError, match="already"):
        scheduler.submit(Request("ok", [3], 3))
    with pytest.raises(ValueError, match="continuous, static"):
        Scheduler(tiny_engine, n_blocks=4, mode="dynamic")


def test_a_full_cache_preempts_and_recomputes_without_changing_outputs(tiny_engine):
    requests = stream(8, seed=2, max_prompt=12, max_new=30, every=1)
    scheduler = Scheduler(tiny_engine, n_blocks=12, block_size=4, max_batch=6)
    results = scheduler.run(requests)
    assert sum(r.preemptions for r in results) > 0  # the cache really was too small for everyone
    for result, request in zip(results, requests):
        assert result.error is None and result.tokens == solo(tiny_engine, request)
    assert scheduler.cache.blocks.n_free == 12


def test_stop_tokens_retire_a_request_early(tiny_engine):
    request = stream(1, seed=3, max_new=2)[0]
    request.max_new_tokens = 20
    full = solo(tiny_engine, request)
    request.stop_tokens = (full[4],)
    result = Scheduler(tiny_engine, n_blocks=32, block_size=4).run([request])[0]
    assert result.tokens == full[: full.index(full[4]) + 1]


def test_paging_wastes_less_than_reserving_each_requests_maximum(tiny_engine):
    scheduler = Scheduler(tiny_engine, n_blocks=64, block_size=4, max_batch=4)
    scheduler.run(stream(8, seed=4))
    busy = [
        (m, r) for m, r in zip(scheduler.memory, scheduler.reserved_if_contiguous) if m.used_slots
    ]
    assert busy
    for memory, reserved in busy:
        assert memory.wasted_slots < 4 * 4  # at most one partly filled block per request
        assert memory.allocated_slots <= reserved + 4 * 4
    assert sum(m.allocated_slots for m, _ in busy) < sum(r for _, r in busy)


@pytest.mark.slow
def test_smollm2_continuous_batching_matches_solo_decoding(smollm2, smollm2_engine):
    _, tokenizer = smollm2
    texts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea, there lived",
    ]
    requests = [
        Request(i, tokenizer(t).input_ids, new, arrival_step=i * 3)
        for i, (t, new) in enumerate(zip(texts, (16, 6, 12)))
    ]
    results = Scheduler(smollm2_engine, n_blocks=8, block_size=8, max_batch=2).run(requests)
    for result, request in zip(results, requests):
        assert result.tokens == solo(smollm2_engine, request)


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_prefill_changes_no_output_and_bounds_prefill_per_step(tiny_engine, chunk):
    requests = stream(8, seed=5, max_prompt=40, every=1)
    scheduler = Scheduler(tiny_engine, n_blocks=64, block_size=4, max_batch=4, prefill_chunk=chunk)
    prefilled_per_step, model = [], scheduler.model
    real_forward = model.forward

    def counting_forward(tokens, *args, **kwargs):
        if tokens.shape[1] > 1 or kwargs.get("last_only"):
            prefilled_per_step[-1] += tokens.numel()
        return real_forward(tokens, *args, **kwargs)

    real_step = scheduler.step

    def counting_step():
        prefilled_per_step.append(0)
        return real_step()

    model.forward, scheduler.step = counting_forward, counting_step
    try:
        results = scheduler.run(requests)
    finally:
        del model.forward
    for result, request in zip(results, requests):
        assert result.tokens == solo(tiny_engine, request)
    assert max(prefilled_per_step) <= chunk
    assert sum(prefilled_per_step) == sum(len(r.prompt) for r in requests)
    assert scheduler.cache.blocks.n_free == 64


def test_a_long_prompt_in_chunks_lets_the_others_keep_decoding(tiny_engine):
    short = Request("short", [1, 2, 3], 20)
    long = Request("long", list(range(100)), 4, arrival_step=3)
    whole = {r.request_id: r for r in Scheduler(tiny_engine, 64, 4).run([short, long])}
    chunked = Scheduler(tiny_engine, 64, 4, prefill_chunk=25)
    results = {r.request_id: r for r in chunked.run([short, long])}
    # Whole: the long prompt's first token comes in the step it arrives; chunked: four steps later,
    # and the short request made a token in each of those steps.
    assert whole["long"].first_token_step == 3 and results["long"].first_token_step == 6
    # (step 0 only prefilled, so batch_sizes[k] is step k + 1's decode)
    assert chunked.batch_sizes[2:7] == [1, 1, 1, 1, 2]
    assert results["short"].tokens == whole["short"].tokens == solo(tiny_engine, short)


def test_abort_frees_blocks_and_reasons_are_recorded(tiny_engine):
    seen = []
    scheduler = Scheduler(
        tiny_engine, 64, 4, max_batch=1, on_token=lambda r, t, why: seen.append((r.request_id, why))
    )
    running = scheduler.submit(Request("run", [1, 2, 3], 50))
    waiting = scheduler.submit(Request("wait", [4, 5], 3))
    scheduler.step(), scheduler.step()
    assert scheduler.cache.blocks.n_free < 64 and len(running.tokens) == 2
    assert scheduler.abort("run") is running and running.finish_reason == "abort"
    assert scheduler.abort("nobody") is None
    while not scheduler.idle:
        scheduler.step()
    assert waiting.finish_reason == "length" and seen[-1] == ("wait", "length")
    assert scheduler.cache.blocks.n_free == 64
    scheduler.submit(Request("queued", [1], 3))
    assert scheduler.abort("queued").finish_reason == "abort" and scheduler.idle


def test_sampled_requests_are_repeatable_whatever_their_batch(tiny_engine):
    from memwall.engine import Sampling

    def draw(seed, companions):
        requests = [Request("s", [9, 8, 7], 12, sampling=Sampling(1.5, 1.0, seed))]
        requests += [Request(i, [i + 1] * (i + 2), 12) for i in range(companions)]
        return Scheduler(tiny_engine, 64, 4).run(requests)[0].tokens

    assert draw(3, 0) == draw(3, 3)
    assert draw(3, 0) != draw(4, 0)


def test_same_length_prompts_arriving_together_share_one_prefill(tiny_engine):
    requests = [Request(i, [i + 1, 7, 9, 11, i + 5], 6) for i in range(4)]
    scheduler = Scheduler(tiny_engine, n_blocks=32, block_size=4, max_batch=4)
    calls, real_forward = [], scheduler.model.forward
    scheduler.model.forward = lambda tokens, *a, **k: (
        calls.append(tokens.shape) or real_forward(tokens, *a, **k)
    )
    try:
        results = scheduler.run(requests)
    finally:
        del scheduler.model.forward
    assert calls[0] == (4, 5) and all(shape[1] == 1 for shape in calls[1:])
    for result, request in zip(results, requests):
        assert result.tokens == solo(tiny_engine, request)
