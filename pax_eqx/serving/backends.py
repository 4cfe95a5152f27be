"""What the HTTP app asks of the model it serves (`Backend`), and the language model's backend.

The app never asks which kind of model it serves; it asks the backend:

    endpoints          the routes it answers: "completions", "chat", "classify"
    tokenizer          encode / decode / unknown_characters / vocab_size (text models)
    room(n)            the most new tokens after a prompt of n tokens (< 1: the prompt is too long)
    submit(r, notify)  -> Completion (text models; events as `requests.Completion` documents)
    classify(body)     -> the labels and probabilities of each example (classifiers)
    stats()            -> EngineStats (/metrics)
    failure            None, or why the backend stopped working (/health answers 503)
    start(), stop(drain=True), busy()

Three backends: `LanguageModelBackend` (here: the continuous-batching Engine, every decoder-only
LM), `seq2seq_backend.Seq2SeqBackend` (an encoder-decoder, one request at a time) and
`classifier_backend.ClassifierBackend`. `pax_eqx.serve` picks one from the model's hooks.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from pax_eqx.serving.engine import Engine, EngineStats
from pax_eqx.serving.requests import Completion, Finished, Request

log = logging.getLogger("pax_eqx.serving")


class Backend(Protocol):
    endpoints: frozenset[str]
    tokenizer: Any
    max_seq_len: int
    failure: str | None

    def room(self, prompt_tokens: int) -> int: ...
    def submit(self, request: Request, notify: Any = None) -> Completion: ...
    def classify(self, body: Any) -> dict[str, Any]: ...
    def stats(self) -> EngineStats: ...
    def start(self) -> None: ...
    def stop(self, drain: bool = True, timeout_s: float | None = None) -> None: ...
    def busy(self) -> bool: ...


class LanguageModelBackend(Engine):
    """A decoder-only language model: the Engine (continuous batching), answering completions
    and chat. A step that raises (a bug, a device error) ends every request in flight with
    reason "cancelled" and records `failure` (/health says it), instead of leaving their clients
    waiting on a dead thread."""

    endpoints = frozenset({"completions", "chat"})
    failure: str | None = None

    def room(self, prompt_tokens: int) -> int:
        return self.max_seq_len - prompt_tokens

    def classify(self, body: Any) -> dict[str, Any]:
        raise NotImplementedError("a language model does not classify")

    def step(self) -> None:
        try:
            super().step()
        except Exception as e:
            self.failure = f"the engine's step failed: {type(e).__name__}: {e}"
            log.exception("the engine's step failed; every request in flight is ended")
            with self._lock:
                self._accepting = False
                ended = [*self.waiting, *(s.completion for s in self.slots if s is not None)]
                self.waiting.clear()
                self.slots = [None] * len(self.slots)
            for c in ended:
                c.put(Finished("cancelled", "", len(c.request.prompt), 0))
            raise
