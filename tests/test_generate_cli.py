"""`memwall generate` runs the engine end to end and rejects bad options before loading anything."""

import json

import pytest

from memwall.cli import main
from memwall.engine.cli import prompt_ids


class FakeTokenizer:
    """Records how the prompt was turned into ids: through the chat template or as plain text."""

    def __init__(self, chat_template):
        self.chat_template = chat_template

    def __call__(self, text):
        return type("Encoded", (), {"input_ids": [1, 2, 3]})()

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        assert messages == [{"role": "user", "content": "hi"}] and add_generation_prompt
        return [9, 1, 2, 3, 9]


def test_instruct_models_get_the_chat_template_unless_raw():
    chat = FakeTokenizer(chat_template="{{ messages }}")
    assert prompt_ids(chat, "hi") == [9, 1, 2, 3, 9]
    assert prompt_ids(chat, "hi", raw=True) == [1, 2, 3]
    assert prompt_ids(FakeTokenizer(chat_template=None), "hi") == [1, 2, 3]  # a base model


@pytest.mark.slow
def test_generate_json_reports_text_and_timing(capsys, smollm2):
    argv = ["generate", "What is the capital of France?", "--max-tokens", "12", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chat_template"] is True and "Paris" in out["text"]
    assert 1 <= out["new_tokens"] <= 12 and out["ttft_ms"] > 0
    assert (
        main(["generate", "The capital of France is", "--max-tokens", "4", "--raw", "--json"]) == 0
    )
    raw = json.loads(capsys.readouterr().out)
    assert raw["chat_template"] is False and raw["prompt_tokens"] < out["prompt_tokens"]


@pytest.mark.parametrize(
    "argv, message", [(["--top-p", "2"], "top_p"), (["--max-tokens", "0"], "--max-tokens")]
)
def test_generate_rejects_bad_options(capsys, argv, message):
    assert main(["generate", "hi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
