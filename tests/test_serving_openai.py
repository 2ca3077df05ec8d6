"""`memwall serve` driven by the official `openai` client, on a tiny random-weight model (loopback)."""

import copy
import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch
from serving_fixtures import ByteTokenizer, base_url, patched_step, tiny_server, wait_until_idle

from memwall.engine import generate

PROMPT = "The weights are read once per step"


@pytest.fixture(scope="module")
def server(tiny_engine):
    with tiny_server(tiny_engine) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=base_url(server), api_key="unused", max_retries=0, timeout=60)


def greedy_text(engine, prompt, n):
    tokens = generate(engine, ByteTokenizer()(prompt).input_ids, n).tokens
    return tokens, ByteTokenizer().decode(tokens)


def raw(server, method, path, body=b"", headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    status, data, retry = response.status, response.read(), response.getheader("Retry-After")
    connection.close()
    return status, data, retry


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_completion_is_the_greedy_decode_with_usage(client, tiny_engine):
    _, expected = greedy_text(tiny_engine, PROMPT, 7)
    response = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=7, temperature=0)
    choice = response.choices[0]
    assert choice.text == expected and choice.finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(PROMPT), 7)
    assert response.usage.total_tokens == len(PROMPT) + 7


def test_streamed_chat_equals_unstreamed_and_ends_with_usage(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=9, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=9,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(text) == 9
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    plain = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, stream=True))
    assert all(c.usage is None for c in plain)  # usage only when asked for


def test_eos_stops_with_reason_stop_and_ignore_eos_runs_to_length(tiny_engine):
    tokens, _ = greedy_text(tiny_engine, PROMPT, 12)
    at = next(i for i in range(2, 12) if tokens[i] not in tokens[:i])
    with tiny_server(tiny_engine, eos_token_id=tokens[at]) as server:
        client = openai.OpenAI(base_url=base_url(server), api_key="-", max_retries=0)
        stopped = client.completions.create(
            prompt=PROMPT, model="tiny", max_tokens=12, temperature=0
        )
        assert stopped.choices[0].finish_reason == "stop"
        assert stopped.choices[0].text == ByteTokenizer().decode(tokens[:at])  # no EOS text
        assert stopped.usage.completion_tokens == at + 1
        full = client.completions.create(
            prompt=PROMPT,
            model="tiny",
            max_tokens=12,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text_before_them(client, tiny_engine, stream):
    _, text = greedy_text(tiny_engine, PROMPT, 16)
    at = next(i for i in range(3, 14) if text.find(text[i : i + 2]) == i)
    kwargs = dict(
        model="tiny",
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        stop=["@@never", text[at : at + 2]],
    )
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        got = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**kwargs).choices[0]
        got, reason = choice.text, choice.finish_reason
    assert (got, reason) == (text[:at], "stop")


def test_seed_makes_sampling_repeatable(client):
    def draw(seed):
        return (
            client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.5, seed=seed
            )
            .choices[0]
            .text
        )

    assert draw(7) == draw(7)
    assert len({draw(seed) for seed in (1, 2, 3)}) > 1


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(temperature=5), "temperature"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=250), "exceeds"),
        (dict(prompt="x" * 300), "prompt"),
        (dict(n=2), "n > 1"),
        (dict(logprobs=2), "logprobs"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
        (dict(prompt=[1, 999]), "token ids"),
    ],
)
def test_bad_parameters_get_400_naming_them(client, kwargs, words):
    request = dict(model="tiny", prompt=PROMPT, max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**request)
    assert words in caught.value.body["message"] and caught.value.status_code == 400


def test_unknown_model_gets_an_openai_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["code"] == "model_not_found" and "tiny" in caught.value.body["message"]


def test_malformed_bodies_and_routes(server):
    status, data, _ = raw(server, "POST", "/v1/completions", b"{not json", {"Content-Length": "9"})
    assert status == 400 and "not valid JSON" in json.loads(data)["error"]["message"]
    status, data, _ = raw(server, "POST", "/v1/completions", b"[1, 2]")
    assert status == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"
    connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Length", str(64 * 2**20))
    connection.endheaders()
    assert connection.getresponse().status == 413  # answered without reading the body
    connection.close()
    assert raw(server, "POST", "/v1/embeddings", b"{}")[0] == 404
    assert raw(server, "GET", "/v2/models")[0] == 404


def test_a_full_queue_answers_503_with_retry_after(tiny_engine):
    with tiny_server(tiny_engine, max_batch=1, max_queue=1) as server:
        scheduler, paused, resume = server.loop.scheduler, threading.Event(), threading.Event()
        step = scheduler.step

        def held_step():  # the first step runs; the second waits, so nothing leaves the batch
            if scheduler.step_index >= 1:
                paused.set()
                resume.wait(30)
            return step()

        scheduler.step = held_step
        body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "temperature": 0}).encode()
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(raw, server, "POST", "/v1/completions", body)
            assert paused.wait(30)  # the first request runs and holds the only place
            second = pool.submit(raw, server, "POST", "/v1/completions", body)
            while server.loop.stats()["waiting"] < 1:
                threading.Event().wait(0.01)
            status, data, retry = raw(server, "POST", "/v1/completions", body)
            resume.set()
            assert (
                status == 503 and retry == "1" and "waiting" in json.loads(data)["error"]["message"]
            )
            assert first.result()[0] == 200 and second.result()[0] == 200


def test_concurrent_requests_share_decode_steps(server, client, tiny_engine):
    prompts = [f"{i} {PROMPT}"[: 10 + 3 * i] for i in range(8)]
    scheduler, loop = server.loop.scheduler, server.loop
    before = len(scheduler.batch_sizes)
    gathered = threading.Event()

    def wait_for_all_eight():  # a loaded machine may start the clients far apart
        deadline = time.monotonic() + 10
        while not gathered.is_set() and time.monotonic() < deadline:
            if len(loop._inbox) + len(scheduler.waiting) + len(scheduler.running) >= 8:
                gathered.set()
            time.sleep(0.005)

    def complete(prompt):
        return (
            client.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0)
            .choices[0]
            .text
        )

    with patched_step(server, wait_for_all_eight), ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(complete, prompts))
    assert texts == [
        greedy_text(tiny_engine, p, 40)[1] for p in prompts
    ]  # batching changes nothing
    assert max(scheduler.batch_sizes[before:]) == 8  # ...but the requests were batched


def test_fifty_aborted_streams_leak_no_blocks(server, client):
    def read_two_then_leave(i):
        stream = client.completions.create(
            model="tiny",
            prompt=f"{i}: {PROMPT}",
            max_tokens=200,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for _, _chunk in zip(range(2), stream):
            pass
        stream.close()

    finished_before = len(server.loop.finished)
    # 5 ms steps: a stream left running would take a second to reach its 200 tokens.
    with patched_step(server, lambda: time.sleep(0.005)), ThreadPoolExecutor(16) as pool:
        list(pool.map(read_two_then_leave, range(50)))
    stats = wait_until_idle(server)
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["free_blocks"] == stats["total_blocks"] and stats["failures"] == 0
    assert len(server.loop.finished) == finished_before  # every one was aborted, none ran out


def test_a_small_cache_preempts_and_still_answers_exactly(tiny_engine):
    prompts = [f"{i}: {PROMPT}"[:20] for i in range(6)]
    with tiny_server(tiny_engine, kv_tokens=128, block_size=8) as server:  # 16 blocks for all
        client = openai.OpenAI(base_url=base_url(server), api_key="-", max_retries=0)

        def complete(prompt):
            return (
                client.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0)
                .choices[0]
                .text
            )

        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(complete, prompts))
        stats = wait_until_idle(server)
    assert texts == [greedy_text(tiny_engine, p, 40)[1] for p in prompts]
    assert stats["preemptions"] > 0 and stats["free_blocks"] == stats["total_blocks"] == 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_serves_on_a_gpu_unchanged(tiny_engine):
    engine = copy.deepcopy(tiny_engine).to("cuda")
    _, expected = greedy_text(engine, PROMPT, 8)  # the engine's own decode on the same device
    with tiny_server(engine) as server:
        client = openai.OpenAI(base_url=base_url(server), api_key="-", max_retries=0)
        text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
        sampled = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=1
        )
    assert text.choices[0].text == expected and sampled.usage.completion_tokens == 8


def test_per_step_records_stay_bounded(tiny_engine, monkeypatch):
    from memwall.serving import engine_loop

    monkeypatch.setattr(engine_loop, "HISTORY_STEPS", 10)
    with tiny_server(tiny_engine) as server:
        client = openai.OpenAI(base_url=base_url(server), api_key="-", max_retries=0)
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0)
        scheduler = server.loop.scheduler
        # (the last step may not have been trimmed yet when the answer arrives)
        assert scheduler.step_index >= 25 and 5 <= len(scheduler.step_times_s) <= 11
        assert len(scheduler.memory) == len(scheduler.step_times_s)


def test_the_compiled_path_serves_the_readable_engines_text(tiny_engine):
    """The GPU's speed path (here under torch.compile on the CPU): the server's decode steps run
    compiled on the scheduler's paged cache, batched, and each client gets the readable text."""
    from memwall.engine.cuda import compiled
    from memwall.engine.cuda.paged import CompiledPagedCache

    prompts = [PROMPT, "Batch", "Decode is memory-bound when a step has few rows"]
    with tiny_server(compiled(tiny_engine)) as running:
        assert isinstance(running.loop.scheduler.cache, CompiledPagedCache)
        client = openai.OpenAI(base_url=base_url(running), api_key="-", max_retries=0, timeout=120)

        def complete(prompt):
            return client.completions.create(
                model="tiny", prompt=prompt, max_tokens=9, temperature=0
            ).choices[0]

        with ThreadPoolExecutor(len(prompts)) as pool:
            choices = list(pool.map(complete, prompts))
    for prompt, choice in zip(prompts, choices):
        assert choice.text == greedy_text(tiny_engine, prompt, 9)[1]
        assert choice.finish_reason == "length"
