"""`memwall bench serve` against memwall's own server and against servers that misbehave (loopback)."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from serving_fixtures import tiny_server, wait_until_idle

from memwall.bench.load import base_url, run_load
from memwall.bench.serve import parse_levels, sweep


@pytest.fixture(scope="module")
def server(tiny_engine):
    with tiny_server(tiny_engine) as running:
        yield running


def url(server):
    return f"http://127.0.0.1:{server.server_port}"


def test_cli_sweep_reports_every_request_against_memwalls_server(server):
    command = [sys.executable, "-m", "memwall.cli", "bench", "serve", "--url", url(server) + "/v1/"]
    command += ["--concurrency", "1,4", "--max-tokens", "6", "--ignore-eos", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [r["concurrency"] for r in runs] == [1, 4] and [r["requests"] for r in runs] == [8, 16]
    for run in runs:
        assert run["model"] == "tiny" and run["url"] == url(server) + "/v1"
        assert run["succeeded"] == run["requests"] and run["cut_short"] == run["failed"] == 0
        assert run["tokens_per_request"] == [6] * run["requests"]
        assert run["finish_reasons"] == {"length": run["requests"]}
        assert run["output_tokens"] == 6 * run["requests"] and run["per_user_tok_per_s"] > 0
    assert wait_until_idle(server)["free_blocks"] == server.loop.stats()["total_blocks"]


def test_poisson_arrivals_and_the_chat_endpoint(server):
    summary = run_load(
        url(server),
        concurrency=3,
        requests=6,
        max_tokens=4,
        ignore_eos=True,
        request_rate=40.0,
        endpoint="chat",
        duration_s=60,
    )
    assert summary["requests"] == summary["succeeded"] == 6 and summary["request_rate"] == 40.0
    starts = [r["start_s"] for r in summary["per_request"]]
    assert starts == sorted(starts) and starts[-1] > starts[0]  # they arrived spread out


def short_streaming_server(finish_reason, send_done=True):
    """A fake endpoint that streams three pieces whatever was asked, like a server that
    interrupts running requests; no usage is reported."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            data = json.dumps({"data": [{"id": "fake"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i, piece in enumerate("abc"):
                reason = finish_reason if i == 2 else None
                event = {"choices": [{"index": 0, "text": piece, "finish_reason": reason}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            if send_done:
                self.wfile.write(b"data: [DONE]\n\n")

    fake = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    return fake


@pytest.mark.parametrize(
    "finish_reason, send_done, ignore_eos",
    [("stop", True, True), ("length", True, True), (None, True, False), ("stop", False, False)],
)
def test_requests_cut_short_are_not_reported_ok(finish_reason, send_done, ignore_eos):
    fake = short_streaming_server(finish_reason, send_done)
    try:
        summary = run_load(
            f"http://127.0.0.1:{fake.server_port}",
            concurrency=2,
            requests=4,
            max_tokens=8,
            ignore_eos=ignore_eos,
            duration_s=30,
        )
    finally:
        fake.shutdown()
    assert summary["succeeded"] == 0 and summary["cut_short"] == 4
    assert summary["tokens_per_request"] == [3] * 4 and summary["model"] == "fake"
    assert summary["finish_reasons"] == {str(finish_reason): 4}


def test_a_short_answer_that_really_stopped_is_ok():
    fake = short_streaming_server("stop")
    try:
        summary = run_load(f"http://127.0.0.1:{fake.server_port}", requests=2, max_tokens=8)
    finally:
        fake.shutdown()
    assert summary["succeeded"] == 2  # without --ignore-eos, stopping early is the model's choice


def test_urls_with_or_without_v1_and_malformed_ones():
    for given in ("http://h:80", "http://h:80/", "http://h:80/v1", "http://h:80/v1/"):
        assert base_url(given) == "http://h:80/v1"
    assert base_url("https://example.org/api/v1") == "https://example.org/api/v1"
    for bad in ("127.0.0.1:8000", "http://h:notaport", "ftp://h", "http://h/v1/completions", ""):
        with pytest.raises(ValueError, match="base URL"):
            base_url(bad)
    command = [sys.executable, "-m", "memwall.cli", "bench", "serve", "--url", "localhost:8000"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "http://127.0.0.1:8000" in lines[0]
    with pytest.raises(ValueError, match="1,2,4,8"):
        parse_levels("1,two")


def test_nothing_listening_is_an_error_not_a_hang():
    runs = sweep("http://127.0.0.1:9", [2], requests=3, max_tokens=4, duration_s=5, timeout_s=2)
    assert runs[0]["requests"] == runs[0]["failed"] == 3 and runs[0]["errors"]
    with pytest.raises(ValueError):
        run_load("http://127.0.0.1:9", concurrency=0)


def test_a_sweep_sends_its_requests_per_client_with_two_clients_worth_at_least():
    runs = sweep(
        "http://127.0.0.1:9", [1, 3], per_client=2, max_tokens=4, duration_s=5, timeout_s=2
    )
    assert [run["requests"] for run in runs] == [4, 6]


def test_bench_serve_sends_the_api_key_a_keyed_server_wants(tiny_engine):
    with tiny_server(tiny_engine, api_key="sk-bench") as keyed:
        options = dict(concurrency=2, requests=2, max_tokens=3, ignore_eos=True, duration_s=60)
        refused = run_load(url(keyed), **options)
        served = run_load(url(keyed), api_key="sk-bench", **options)
    assert refused["failed"] == 2 and "HTTP 401" in refused["errors"][0]
    assert served["succeeded"] == 2 and served["model"] == "tiny"
    assert "sk-bench" not in json.dumps(served)  # the key stays out of what is reported
