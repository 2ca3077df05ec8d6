"""`memwall generate` runs the engine end to end and rejects bad options before loading anything."""

import json

import pytest

from memwall.cli import main


@pytest.mark.slow
def test_generate_json_reports_text_and_timing(capsys, smollm2):
    assert main(["generate", "The capital of France is", "--max-tokens", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["new_tokens"] >= 1 and "Paris" in out["text"]
    assert out["ttft_ms"] > 0


def test_generate_rejects_bad_sampling(capsys):
    assert main(["generate", "hi", "--top-p", "2"]) == 2
    assert "top_p" in capsys.readouterr().err
