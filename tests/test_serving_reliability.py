"""A bounded load test of memwall's server (loopback only): many requests, random client aborts, a
burst of malformed requests; plus the prefill/decode interference measurement on the tiny model."""

import http.client
import json
import random
from concurrent.futures import ThreadPoolExecutor

from serving_fixtures import ByteTokenizer, tiny_server, wait_until_idle

from memwall.bench.interference import measure_interference

REQUESTS, CONCURRENCY = 200, 16


def post(port, body: bytes, headers=None, abort_after=None):
    """(status, parsed answer or None if we hung up first). abort_after=k: leave after k reads."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/completions", body, headers or {})
        if abort_after == 0:
            return None, None  # gone before the answer
        response = connection.getresponse()
        if abort_after is not None:
            for _ in range(abort_after):
                response.readline()
            return response.status, None
        return response.status, response.read()
    finally:
        connection.close()


def completion_tokens(stream: bool, data: bytes) -> int:
    if not stream:
        return json.loads(data)["usage"]["completion_tokens"]
    events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: {")]
    return json.loads(events[-1])["usage"]["completion_tokens"]


def good_request(port, i):
    rng = random.Random(i)
    stream, max_tokens = rng.random() < 0.6, rng.randint(1, 24)
    body = {"prompt": f"request {i}: " + "x" * rng.randint(0, 40), "max_tokens": max_tokens}
    body |= {"stream": stream, "ignore_eos": True, "temperature": rng.choice([0, 0.8])}
    if stream:
        body["stream_options"] = {"include_usage": True}
    abort_after = rng.choice([0, 1, 3]) if rng.random() < 0.25 else None
    status, data = post(port, json.dumps(body).encode(), abort_after=abort_after)
    if abort_after is not None:
        return "aborted"
    assert status == 200, data
    assert completion_tokens(stream, data) == max_tokens, (i, data[-300:])
    return "ok"


MALFORMED = [
    (b"{", {}),
    (b'{"prompt": "a", "max_tokens": -1}', {}),
    (b'{"prompt": "a", "model": "gpt-9"}', {}),
    (b'{"prompt": ""}', {}),
    (b'{"prompt": "a", "temperature": "hot"}', {}),
    (b'{"prompt": "a", "max_tokens": 100000}', {}),
    (b"\xff\xfe", {}),
    (b"[]", {}),
]


def malformed_request(port, i):
    body, headers = MALFORMED[i % len(MALFORMED)]
    status, data = post(port, body, headers)
    assert 400 <= status < 500 and "error" in json.loads(data), (body, status, data)
    return status


def test_load_with_aborts_and_malformed_requests_leaks_nothing(tiny_engine, capfd):
    with tiny_server(tiny_engine, max_batch=8, max_queue=256) as server:
        port = server.server_port
        with ThreadPoolExecutor(CONCURRENCY) as pool, ThreadPoolExecutor(4) as bad_pool:
            good = [pool.submit(good_request, port, i) for i in range(REQUESTS)]
            bad = [bad_pool.submit(malformed_request, port, i) for i in range(40)]
            outcomes = [f.result(timeout=120) for f in good]
            statuses = [f.result(timeout=120) for f in bad]
        assert outcomes.count("ok") > REQUESTS / 2 and "aborted" in outcomes
        assert set(statuses) == {400, 404}
        stats = wait_until_idle(server)
        assert stats["running"] == stats["waiting"] == 0 and stats["failures"] == 0
        assert stats["free_blocks"] == stats["total_blocks"]  # every aborted request gave its back
        assert good_request(port, 0) == "ok"  # and the server still serves
    assert "Traceback" not in capfd.readouterr().err  # a client that left is a log line at most


def test_chunked_prefill_lets_streams_keep_decoding(tiny_engine):
    result = measure_interference(
        tiny_engine,
        ByteTokenizer(),
        prompt_tokens=200,
        streams=2,
        prefill_chunks=(None, 8),
        timeout_s=60,
    )
    whole, chunked = result["runs"]
    assert (whole["prefill_chunk"], chunked["prefill_chunk"]) == (None, 8)
    for run in result["runs"]:
        assert run["tpot_before_ms"] > 0 and run["long_ttft_ms"] > 0
        assert run["max_gap_during_ms"] >= run["tpot_during_ms"] > 0
    # 200 tokens in chunks of 8 take 25 steps, and the streams decode in each: 24 before the
    # step that gives the long prompt its first token. A whole prefill happens in one step.
    assert (whole["engine_steps_during_prefill"], chunked["engine_steps_during_prefill"]) == (0, 24)
    assert chunked["stream_tokens_during_prefill"] >= 20  # the clients saw those tokens arrive
