"""What a client asks of the engine (`Request`) and what it gets back (`Completion`'s events).

Errors a client can cause are `RequestError` (HTTP 400: the field, the value, the fix) and
`QueueFull` (HTTP 429, with how long to wait); nothing a request holds reaches a compiled program
as a shape, so no request can make the server compile or crash.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Literal

from pax_eqx.config import SEED_MAX

FinishReason = Literal["stop", "length", "timeout", "cancelled"]


class RequestError(ValueError):
    """A request the server refuses (HTTP 400): `field` names what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class QueueFull(RuntimeError):
    """Every slot is busy and the waiting queue is full (HTTP 429); retry after `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"the server's queue is full; retry in {retry_after_s:.0f} s.")
        self.retry_after_s = retry_after_s


class ShuttingDown(RuntimeError):
    """The server is draining its in-flight requests before it exits (HTTP 503)."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One continuation to generate. prompt: token ids (at least one). max_tokens: new tokens at
    most. temperature 0 = greedy; top_k 0 = off; top_p 1 = off; seed: the sampling seed (the same
    seed gives the same tokens, whatever shares the batch). stop: strings that end the text
    (excluded from it). timeout_s: the longest the request may take, queueing included."""

    prompt: tuple[int, ...]
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    timeout_s: float = 600.0

    def check(self, *, max_seq_len: int, vocab_size: int) -> None:
        """RequestError naming the first field that is out of range."""
        if not self.prompt:
            raise RequestError("prompt", "the prompt is empty; send at least one token of text.")
        if any(not 0 <= t < vocab_size for t in self.prompt):
            raise RequestError("prompt", f"the prompt has token ids outside the vocabulary [0, {vocab_size}).")
        if self.max_tokens < 1:
            raise RequestError("max_tokens", f"max_tokens={self.max_tokens}; ask for at least 1.")
        if len(self.prompt) + self.max_tokens > max_seq_len:
            raise RequestError(
                "max_tokens",
                f"a prompt of {len(self.prompt)} tokens + max_tokens={self.max_tokens} needs "
                f"{len(self.prompt) + self.max_tokens} positions; the model has {max_seq_len}: lower max_tokens "
                f"to {max(max_seq_len - len(self.prompt), 0)} or shorten the prompt.",
            )
        if not 0 <= self.temperature <= 100:
            raise RequestError("temperature", f"temperature={self.temperature}; use 0 (greedy) to 100.")
        if self.top_k < 0:
            raise RequestError("top_k", f"top_k={self.top_k}; use 0 (off) or more.")
        if not 0 < self.top_p <= 1:
            raise RequestError("top_p", f"top_p={self.top_p}; use a value in (0, 1] (1 = off).")
        if not 0 <= self.seed <= SEED_MAX:
            raise RequestError("seed", f"seed={self.seed}; use 0 to {SEED_MAX}.")
        if not 0 < self.timeout_s:
            raise RequestError("timeout", f"timeout={self.timeout_s}; give a positive number of seconds.")


@dataclasses.dataclass(frozen=True)
class Token:
    """A new token and the text it adds (empty while the text may still become a stop string);
    id -1: no new token, only text held back until the request ended."""

    id: int
    text: str


@dataclasses.dataclass(frozen=True)
class Finished:
    """The request ended: why, its whole text, and its token counts."""

    reason: FinishReason
    text: str
    prompt_tokens: int
    completion_tokens: int


Event = Token | Finished


class Completion:
    """A submitted request as it runs: `events` yields Token events then one Finished (thread-safe;
    `notify`, if given, is called after each event, e.g. to wake an asyncio loop). `cancel()`
    frees its slot at the engine's next step (a client that went away)."""

    def __init__(self, request: Request, notify: Callable[[], None] | None = None) -> None:
        self.request = request
        self.events: queue.Queue[Event] = queue.Queue()
        self.notify = notify
        self.submitted = time.perf_counter()
        self.first_token: float | None = None
        self.finished: Finished | None = None
        self._cancelled = threading.Event()
        self._done = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, event: Event) -> None:
        if isinstance(event, Token) and self.first_token is None:
            self.first_token = time.perf_counter()
        self.events.put(event)
        if isinstance(event, Finished):
            self.finished = event
            self._done.set()
        if self.notify is not None:
            self.notify()

    def result(self, timeout: float | int | None = None) -> Finished:
        """Blocks until the request ends; its Finished event (the `events` queue is left to
        whoever streams it). TimeoutError if it has not ended within `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the request has not ended within {timeout} s.")
        assert self.finished is not None
        return self.finished
