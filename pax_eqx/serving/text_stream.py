"""A request's tokens turned into text as they come, holding back what may still become a stop.

Two things make streamed text differ from `tokenizer.decode(ids)[len(sent):]`: a token may end in
the middle of a character (byte tokenizers decode it as U+FFFD until the rest arrives), and the
text's end may be the start of a stop string, which must not be sent if the next tokens complete
it. Both are held back until resolved; what is sent is always a prefix of the final text.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    """`push(token) -> (new text to send, stopped)`; `text` is everything decided so far."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.sent = ""

    def push(self, token: int) -> tuple[str, bool]:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            return self._send(text[:cut]), True
        hold = len(text) - len(text.rstrip("\ufffd"))  # an unfinished character
        for s in self.stop:  # the longest end of the text that begins a stop string
            hold = max(hold, next((n for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])), 0))
        return self._send(text[: len(text) - hold]), False

    def finish(self) -> str:
        """The rest of the text once no more tokens come (held-back characters included)."""
        text = self.tokenizer.decode(self.ids)
        return self._send(text)

    def _send(self, text: str) -> str:
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new
