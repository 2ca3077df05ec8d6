"""`memwall bench serve` against memwall's own OpenAI-compatible server on 127.0.0.1."""

import json
import urllib.request

import pytest

from memwall.serving.load import run_load
from memwall.serving.server import start_server


@pytest.fixture(scope="module")
def server_url(smollm2, smollm2_engine):
    server = start_server(smollm2_engine, smollm2[1])
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.slow
def test_streamed_text_equals_greedy_generation(server_url, smollm2, smollm2_engine):
    from memwall.engine import generate

    tokenizer = smollm2[1]
    prompt = "The three costs of a generated token are"
    status, body = post(
        server_url + "/v1/completions",
        {"prompt": prompt, "max_tokens": 6, "stream": True, "temperature": 0},
    )
    assert status == 200
    chunks = [
        json.loads(line[5:])
        for line in body.splitlines()
        if line.startswith("data:") and "[DONE]" not in line
    ]
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    expected = generate(
        smollm2_engine, tokenizer(prompt).input_ids, 6, stop_tokens=[tokenizer.eos_token_id]
    )
    assert streamed == tokenizer.decode(expected.tokens)
    assert body.rstrip().endswith("data: [DONE]")


@pytest.mark.slow
def test_bad_requests_get_clear_400(server_url):
    status, body = post(server_url + "/v1/completions", {"prompt": "", "max_tokens": 4})
    assert status == 400 and "prompt" in body
    status, body = post(server_url + "/v1/completions", {"prompt": "hi", "max_tokens": 10**6})
    assert status == 400 and "max_tokens" in body


@pytest.mark.slow
def test_bench_serve_reports_ttft_and_tpot_under_load(server_url):
    summary = run_load(server_url, concurrency=2, requests=4, max_tokens=4, duration_s=120)
    assert summary["succeeded"] == 4 and summary["failed"] == 0
    assert summary["output_tokens"] == 16
    assert 0 < summary["ttft"]["median_ms"] <= summary["ttft"]["p90_ms"]
    assert summary["tpot"]["median_ms"] > 0
    assert summary["throughput_tok_per_s"] > 0


def test_bench_serve_bounded_when_nothing_listens():
    summary = run_load(
        "http://127.0.0.1:9", concurrency=2, requests=3, max_tokens=4, duration_s=5, timeout_s=2
    )
    assert summary["requests"] == 3 and summary["succeeded"] == 0 and summary["errors"]
    with pytest.raises(ValueError):
        run_load("http://127.0.0.1:9", concurrency=0)
