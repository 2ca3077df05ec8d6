"""memwall's server with the real SmolLM2 model (slow); the tiny-model tests are in
test_serving_openai.py and test_serving_load.py."""

import json
import urllib.error
import urllib.request

import pytest

from memwall.bench.load import run_load
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
    summary = run_load(
        server_url, concurrency=2, requests=4, max_tokens=4, duration_s=120, ignore_eos=True
    )
    assert summary["succeeded"] == 4 and summary["failed"] == summary["cut_short"] == 0
    assert summary["output_tokens"] == 16 and summary["tokens_per_request"] == [4] * 4
    assert 0 < summary["ttft"]["median_ms"] <= summary["ttft"]["p90_ms"]
    assert summary["tpot"]["median_ms"] > 0
    assert summary["throughput_tok_per_s"] > 0


def test_serve_cli_rejects_bad_options_in_one_line():
    import subprocess
    import sys

    command = [sys.executable, "-m", "memwall.cli", "serve", "--prefill-chunk", "-1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--prefill-chunk" in lines[0]


@pytest.mark.slow
def test_memwall_serve_command_answers_the_openai_client():
    import subprocess
    import sys

    import openai

    command = [sys.executable, "-m", "memwall.cli", "serve", "--port", "0", "--kv-tokens", "1024"]
    command += ["--prefill-chunk", "32", "--device", "cpu"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        banner = server.stdout.readline()
        url = banner.split(" at ")[1].split(":", 2)
        base = f"http://127.0.0.1:{url[2].split('/')[0]}/v1"
        client = openai.OpenAI(base_url=base, api_key="-", max_retries=0, timeout=120)
        answer = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=5,
            temperature=0,
        )
        assert answer.usage.completion_tokens <= 5 and answer.choices[0].message.content
        assert answer.choices[0].finish_reason in ("stop", "length")
    finally:
        server.terminate()
        server.wait(timeout=30)
