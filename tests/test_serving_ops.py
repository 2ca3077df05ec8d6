"""`memwall serve` as an operator runs it: graceful shutdown, /metrics, the access log, an API key,
CORS, the fast path and the command's checks of its address. Tiny model, loopback only."""

import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_fixtures import base_url, patched_step, tiny_server, wait_until_idle

from memwall.serving.shutdown import drain

PROMPT = "The weights are read once per step"
ROOT = Path(__file__).resolve().parent.parent


def raw(server, method, path, body=b"", headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def scrape(server) -> dict:
    """{sample name with its labels: value} from /metrics, read by Prometheus' own parser."""
    status, data, headers = raw(server, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(data.decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples


def wait_for(condition, timeout_s=30.0) -> None:
    """Return once condition() holds; fail the test if it does not within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def client_for(server, **options):
    options = {"api_key": "-", "max_retries": 0, "timeout": 60} | options
    return openai.OpenAI(base_url=base_url(server), **options)


# ---- /metrics ----------------------------------------------------------------------------------


def test_metrics_count_what_was_served(tiny_engine):
    with tiny_server(tiny_engine) as server:
        client = client_for(server)
        for n in (3, 5):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=n, temperature=0)
        list(client.completions.create(model="tiny", prompt="ab", max_tokens=4, stream=True))
        wait_until_idle(server)
        m = scrape(server)
    assert m["memwall:prompt_tokens_total"] == 2 * len(PROMPT) + 2
    assert m["memwall:generation_tokens_total"] == 3 + 5 + 4
    assert m["memwall:request_success_total{finished_reason=length}"] == 3
    assert m["memwall:time_to_first_token_seconds_count"] == 3
    assert m["memwall:time_per_output_token_seconds_count"] == 2 + 4 + 3  # gaps between tokens
    assert m["memwall:e2e_request_latency_seconds_count"] == 3
    assert m["memwall:e2e_request_latency_seconds_bucket{le=+Inf}"] == 3
    assert m["memwall:e2e_request_latency_seconds_sum"] > 0
    assert m["memwall:num_requests_running"] == m["memwall:num_requests_waiting"] == 0
    assert m["memwall:kv_cache_usage_perc"] == 0 and m["memwall:server_draining"] == 0


def test_metrics_show_the_queue_and_the_kv_cache_under_load(tiny_engine):
    gathered, held, release = threading.Event(), threading.Event(), threading.Event()

    def hold():  # once all 5 are in, one more step counts them; then the engine waits
        if server.loop.scheduler.step_index < 2:
            return
        if not gathered.is_set():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                stats = server.loop.stats()
                if stats["running"] + stats["waiting"] == 5:
                    break
                time.sleep(0.01)
            gathered.set()
            return
        held.set()
        release.wait(30)

    with tiny_server(tiny_engine, max_batch=2) as server, patched_step(server, hold):
        client = client_for(server)

        def complete(i):
            return client.completions.create(
                model="tiny", prompt=f"{i} {PROMPT}", max_tokens=8, temperature=0
            )

        with ThreadPoolExecutor(5) as pool:
            answers = [pool.submit(complete, i) for i in range(5)]
            assert held.wait(30)
            m = scrape(server)
            release.set()
            assert all(a.result(timeout=60).usage.completion_tokens == 8 for a in answers)
    assert m["memwall:num_requests_running"] == 2 and m["memwall:num_requests_waiting"] == 3
    assert 0 < m["memwall:kv_cache_usage_perc"] < 1


# ---- the access log ----------------------------------------------------------------------------


def test_one_log_line_per_request_and_a_disconnect_is_one_line(tiny_engine, caplog, capfd):
    def leave_early(port, i):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = {"prompt": f"{i}: {PROMPT}", "max_tokens": 200, "stream": True, "ignore_eos": True}
        connection.request("POST", "/v1/completions", json.dumps(body))
        if i % 2:  # half leave before the answer starts, half after its first event
            connection.getresponse().readline()
        connection.close()

    caplog.set_level("INFO", logger="memwall.serving")
    with tiny_server(tiny_engine) as server:
        with patched_step(server, lambda: time.sleep(0.005)), ThreadPoolExecutor(8) as pool:
            list(pool.map(leave_early, [server.server_port] * 16, range(16)))
            client_for(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
            stats = wait_until_idle(server)
            deadline = time.monotonic() + 10  # the handlers notice their clients within a poll
            while len(caplog.records) < 17 and time.monotonic() < deadline:
                time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if r.name == "memwall.serving"]
    assert len(lines) == 17, lines
    assert sum('"POST /v1/completions" 499 client disconnected' in line for line in lines) == 16
    assert any('"POST /v1/completions" 200 prompt_tokens=' in line for line in lines)
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err
    assert stats["free_blocks"] == stats["total_blocks"]


def test_a_connection_error_outside_a_request_is_one_line(tiny_engine, caplog, capfd):
    caplog.set_level("INFO", logger="memwall.serving")
    with tiny_server(tiny_engine) as server:
        try:  # as when a kept-alive client resets while the server reads its next request
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            server.handle_error(None, ("127.0.0.1", 5555))
    assert [r.getMessage() for r in caplog.records] == [
        "127.0.0.1 client disconnected (ConnectionResetError)"
    ]
    assert "Traceback" not in capfd.readouterr().err


def test_an_unstreamed_request_whose_client_left_is_aborted(tiny_engine):
    body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True}).encode()
    with tiny_server(tiny_engine) as server:
        with patched_step(server, lambda: time.sleep(0.01)):  # 200 tokens would take 2 s
            connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
            connection.request("POST", "/v1/completions", body)
            wait_for(lambda: server.loop.stats()["running"] == 1)
            connection.close()  # nothing was written to it yet: only the poll can tell
            stats = wait_until_idle(server)
            generated = scrape(server)["memwall:generation_tokens_total"]
    assert stats["free_blocks"] == stats["total_blocks"] and len(server.loop.finished) == 0
    assert generated < 100  # it stopped within a poll or so of the client leaving


# ---- a key and a browser -----------------------------------------------------------------------


def test_the_api_key_guards_v1_with_openais_401(tiny_engine):
    with tiny_server(tiny_engine, api_key="sk-class-key") as server:
        with pytest.raises(openai.AuthenticationError) as caught:
            client_for(server, api_key="sk-wrong-key").models.list()
        assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
        status, data, _ = raw(server, "POST", "/v1/completions", b"{}")
        error = json.loads(data)["error"]
        assert status == 401 and "Authorization: Bearer" in error["message"]
        assert error["type"] == "invalid_request_error"
        answer = client_for(server, api_key="sk-class-key").completions.create(
            model="tiny", prompt=PROMPT, max_tokens=2
        )
        assert answer.usage.completion_tokens == 2
        assert raw(server, "GET", "/health")[0] == raw(server, "GET", "/metrics")[0] == 200


def test_cors_preflight_answers_allowed_origins_only(tiny_engine):
    page = "http://localhost:3000"
    with tiny_server(tiny_engine, allowed_origins=[page]) as server:
        ask = {"Origin": page, "Access-Control-Request-Method": "POST"}
        status, _, headers = raw(server, "OPTIONS", "/v1/chat/completions", headers=ask)
        assert status == 204 and headers["Access-Control-Allow-Origin"] == page
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert "Authorization" in headers["Access-Control-Allow-Headers"]
        body = json.dumps({"prompt": PROMPT, "max_tokens": 1}).encode()
        status, _, headers = raw(server, "POST", "/v1/completions", body, {"Origin": page})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == page
        other = {"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"}
        status, data, headers = raw(server, "OPTIONS", "/v1/completions", headers=other)
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
        assert "--allowed-origins" in json.loads(data)["error"]["message"]


# ---- graceful shutdown -------------------------------------------------------------------------


def test_drain_refuses_new_work_and_lets_requests_in_flight_finish(tiny_engine):
    with tiny_server(tiny_engine) as server:
        client = client_for(server)
        with patched_step(server, lambda: time.sleep(0.01)):
            stream = client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=60, stream=True, temperature=0
            )
            chunks = [next(iter(stream))]
            draining = ThreadPoolExecutor(1).submit(drain, server, 30)
            wait_for(lambda: server.service.draining)
            with pytest.raises(openai.InternalServerError) as caught:
                client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
            assert caught.value.status_code == 503
            assert caught.value.body["code"] == "server_shutting_down"
            status, data, _ = raw(server, "GET", "/health")
            assert status == 503 and json.loads(data)["status"] == "draining"
            chunks += list(stream)
            assert draining.result(timeout=30) == {"finished": 1, "cut": 0}
    assert chunks[-1].choices[0].finish_reason == "length" and len(chunks) == 61  # + the last


def test_drain_past_its_timeout_ends_streams_with_a_reason_and_frees_their_blocks(tiny_engine):
    with tiny_server(tiny_engine) as server:
        client = client_for(server)

        def read_all(i):
            stream = client.completions.create(
                model="tiny", prompt=f"{i} {PROMPT}", max_tokens=200, stream=True
            )
            chunks = 0
            try:
                for _ in stream:
                    chunks += 1
            except openai.APIError as error:
                return chunks, str(error)
            return chunks, "finished"

        with patched_step(server, lambda: time.sleep(0.01)), ThreadPoolExecutor(4) as pool:
            outcomes = [pool.submit(read_all, i) for i in range(4)]
            wait_for(lambda: server.loop.stats()["running"] == 4)
            assert drain(server, 0.2) == {"finished": 0, "cut": 4}
            results = [o.result(timeout=30) for o in outcomes]
        blocks = server.loop.scheduler.cache.blocks
    assert all(0 < n < 200 and "shutting down" in why for n, why in results), results
    assert blocks.n_free == blocks.n_blocks


def test_sigterm_during_eight_streams_ends_each_with_a_final_event_and_exits_0():
    command = [sys.executable, str(ROOT / "tests" / "serving_fixtures.py")]
    command += ["--step-delay", "0.02", "--shutdown-timeout", "0.5"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in process.stdout], daemon=True).start()
    try:
        port = int(lines.get(timeout=120).split()[1])
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=60
        )
        started = threading.Semaphore(0)

        def read_all(i):
            stream = client.completions.create(
                model="tiny", prompt=f"{i} {PROMPT}", max_tokens=200, stream=True
            )
            chunks = 0
            try:
                for _ in stream:
                    chunks += 1
                    if chunks == 2:
                        started.release()
            except openai.APIError as error:
                return chunks, error.body
            return chunks, None

        with ThreadPoolExecutor(8) as pool:
            outcomes = [pool.submit(read_all, i) for i in range(8)]
            for _ in range(8):
                assert started.acquire(timeout=60)
            process.send_signal(signal.SIGTERM)
            results = [o.result(timeout=60) for o in outcomes]
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert all(2 <= n < 200 and body["code"] == "server_shutting_down" for n, body in results)
    errors = process.stderr.read()
    assert "SIGTERM: shutting down" in errors and "Traceback" not in errors
    assert (
        errors.count("200 prompt_tokens=") == errors.count("cut short (server_shutting_down)") == 8
    )


# ---- the fast path and the command's checks ----------------------------------------------------


def test_the_fast_path_serves_the_same_tokens(tiny_engine):
    from serving_fixtures import ByteTokenizer

    from memwall.engine import generate
    from memwall.engine.accelerate import accelerate

    expected = generate(tiny_engine, ByteTokenizer()(PROMPT).input_ids, 12).tokens
    with tiny_server(accelerate(tiny_engine)) as server:
        text = client_for(server).completions.create(
            model="tiny", prompt=PROMPT, max_tokens=12, temperature=0
        )
    assert text.choices[0].text == ByteTokenizer().decode(expected)


@pytest.mark.parametrize(
    "options, words",
    [
        (["--port", "70000"], "--port must be between 1 and 65535"),
        (["--port", "-1"], "--port must be between 1 and 65535"),
        (["--host", "192.0.2.7"], "not an address of this machine"),
        (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
        (["--shutdown-timeout", "inf"], "--shutdown-timeout"),
        (["--api-key", " "], "API key must not be empty"),
    ],
)
def test_serve_rejects_a_bad_address_in_one_line(options, words):
    command = [sys.executable, "-m", "memwall.cli", "serve", *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and words in lines[0], lines


def test_serve_warns_when_it_listens_beyond_loopback_without_a_key():
    command = [sys.executable, "-m", "memwall.cli", "serve", "--host", "0.0.0.0", "--port", "0"]
    command += ["--dtype", "int3"]  # stops before the model loads, after the warning
    env = {k: v for k, v in os.environ.items() if k != "MEMWALL_API_KEY"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2 and "without an API key" in done.stderr
    keyed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env | {"MEMWALL_API_KEY": "k"},
    )
    assert keyed.returncode == 2 and "without an API key" not in keyed.stderr


def test_requests_that_broke_the_server_get_an_answer_each(tiny_engine):
    def post(body: bytes):
        status, data, _ = raw(server, "POST", "/v1/completions", body)
        return status, json.loads(data)

    with tiny_server(tiny_engine, max_batch=4) as server:
        server.service.longest_token = 1  # ByteTokenizer's: one character a token
        # T that rounds to 0 in float32 is the greedy limit, not NaN for every request in flight
        status, body = post(b'{"prompt": "hi", "temperature": 1e-300, "max_tokens": 3}')
        assert status == 200 and body["usage"]["completion_tokens"] == 3
        for request, words in [
            (b'{"prompt": "\\ud800", "max_tokens": 2}', "lone surrogate"),
            (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
            (b'{"prompt": "hi", "model": 5}', "'model' must be a string"),
            (b'{"prompt": "hi", "max_completion_tokens": 0}', "'max_completion_tokens'"),
            (json.dumps({"prompt": "x" * 5000}).encode(), "longer than this server's limit"),
        ]:
            status, body = post(request)
            assert status == 400 and words in body["error"]["message"], (request[:40], body)
        status, data, _ = raw(server, "GET", "/v1/models/tiny")
        assert status == 200 and json.loads(data)["id"] == "tiny"
        assert raw(server, "GET", "/v1/models/other")[0] == 404
        status, data, _ = raw(server, "DELETE", "/v1/completions")
        assert status == 405 and "error" in json.loads(data)
        assert server.loop.failures == 0
