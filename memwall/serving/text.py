"""Token ids in, text pieces out, one token at a time, with OpenAI's `stop` strings.

Two things make this more than `tokenizer.decode(token)`:
- a character can span several tokens (UTF-8 bytes, or SentencePiece's leading spaces), so each
  piece is the difference between the decoded text so far and what was already sent, and a piece
  that ends in an incomplete character ("\\ufffd") waits for the next token;
- a stop string can span several tokens, so text that could be the start of one is held back until
  the next token shows whether it is. A client never sees any part of a stop string.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what a decoder yields for the first bytes of an unfinished character


class TextStream:
    def __init__(self, decode, stop_strings=()):
        self.decode = decode  # list[int] -> str
        self.stop_strings = [s for s in stop_strings if s]
        self.ids: list[int] = []
        self.text = ""  # decoded so far
        self.sent = 0  # characters of `text` already handed out
        self.stopped = False  # a stop string was found: nothing more will be sent
        # Only a window of recent tokens is decoded each time (as vLLM does), so a long answer
        # costs O(1) per token: text = decode(ids[prefix:]) minus decode(ids[prefix:read]).
        self._prefix = self._read = 0

    def add(self, token: int) -> str:
        """Take one more token; return the text that may be sent now (often '', never a stop)."""
        if self.stopped:
            return ""
        self.ids.append(token)
        if not self._catch_up():
            return ""  # wait for the rest of the character
        hits = [i for i in (self.text.find(s) for s in self.stop_strings) if i >= 0]
        if hits:
            self.stopped = True
            return self._send_to(min(hits))
        return self._send_to(len(self.text) - self._held_back(self.text))

    def flush(self) -> str:
        """The text still held back, once no more tokens will come."""
        if self.stopped:
            return ""
        if not self._catch_up():  # an unfinished character at the very end: send it as it is
            self.text += self.decode(self.ids[self._prefix :])[len(self._window_text()) :]
            self._prefix = self._read = len(self.ids)
        return self._send_to(len(self.text))

    def _window_text(self) -> str:
        return self.decode(self.ids[self._prefix : self._read])

    def _catch_up(self) -> bool:
        """Append the text of the tokens not yet decoded; False if it ends mid-character."""
        before, after = self._window_text(), self.decode(self.ids[self._prefix :])
        if after.endswith(REPLACEMENT) or len(after) < len(before):
            return False
        self.text += after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        return True

    def _held_back(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper start of some stop string."""
        longest = 0
        for stop in self.stop_strings:
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def _send_to(self, end: int) -> str:
        piece = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece
