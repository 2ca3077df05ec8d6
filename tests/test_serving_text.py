"""Streaming detokenization: multi-byte characters come out whole, stop strings never leak."""

import pytest

from memwall.serving.text import TextStream

TEXT = "Héllo wörld, naïve café 東京 🙂. The stop here. More"


def utf8(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def stream_all(decode, ids, stops=()):
    text = TextStream(decode, stops)
    pieces = [text.add(t) for t in ids] + [text.flush()]
    return pieces, text


def test_bytes_in_whole_characters_out():
    ids = list(TEXT.encode())
    pieces, _ = stream_all(utf8, ids)
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)  # no half characters were ever sent


@pytest.mark.parametrize("stop", ["stop here", "🙂", "e", "More"])
def test_stop_strings_end_the_text_before_them(stop):
    pieces, text = stream_all(utf8, list(TEXT.encode()), ["never there", stop])
    assert "".join(pieces) == TEXT[: TEXT.index(stop)] and text.stopped


def test_a_partial_stop_is_held_back_then_released():
    text = TextStream(utf8, ["abc"])
    assert [text.add(t) for t in b"xab"] == ["x", "", ""]
    assert text.add(ord("d")) == "abd" and text.flush() == ""


def test_an_unfinished_character_at_the_end_is_flushed():
    pieces, _ = stream_all(utf8, list("ok é".encode())[:-1])
    assert "".join(pieces) == "ok \ufffd"


@pytest.mark.slow
def test_real_tokenizer_round_trips(smollm2):
    tokenizer = smollm2[1]
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    pieces, _ = stream_all(lambda i: tokenizer.decode(i, skip_special_tokens=True), ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
