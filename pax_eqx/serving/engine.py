"""Continuous batching: requests share `slots` decode slots, each admitted as one frees.

Every `step()`:

1. requests that were cancelled (a client went away) or ran past their timeout leave their slot;
2. waiting requests take free slots (first come, first served);
3. each slot still reading its prompt prefills one chunk (`SlotPrograms.prefill`); the last
   chunk draws the request's first token;
4. one `generate` call extends every decoding slot by a token; a request ends at its EOS, its
   max_tokens or one of its stop strings, and its slot is free for the next step.

So a short request admitted after a long one finishes first, and a long prompt is read a chunk
per step while the other slots keep generating. `start()` runs steps on a thread until `stop()`;
tests drive `step()` directly. The model runs only in the two compiled programs; everything here
is host bookkeeping on numpy arrays of `slots` entries.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from pax_eqx.serving.requests import Completion, Finished, QueueFull, Request, ShuttingDown, Token
from pax_eqx.serving.row_sampling import RowSampling
from pax_eqx.serving.slot_programs import SlotPrograms
from pax_eqx.serving.text_stream import TextStream


@dataclasses.dataclass
class _Slot:
    """A request in a slot: how much of its prompt is read, its stream, its last token."""

    completion: Completion
    stream: TextStream
    read: int = 0  # prompt tokens prefilled
    last: int = -1  # the token to feed next (-1 while prefilling)
    generated: int = 0


@dataclasses.dataclass
class EngineStats:
    """What /metrics reports: queue depth, busy slots, tokens generated, and the finished
    requests' times (to first token, whole), newest last (a bounded window)."""

    waiting: int
    busy: int
    slots: int
    tokens_total: int
    requests_total: int
    tokens_per_s: float
    ttft_s: list[float]
    latency_s: list[float]


class Engine:
    """Continuous batching of one language model (see the module docstring).

    model: a LanguageModel (its inference parameters); tokenizer: encode/decode, eos_id.
    slots: requests decoded at once; chunk: prompt tokens prefilled per call; max_waiting: the
    queue beyond the slots (full -> QueueFull, HTTP 429; 0: a request is taken only into a free
    slot). admit: "continuous" fills a slot as soon as it frees; "static" only when every slot is
    free (a batch runs until its longest request ends: the baseline continuous batching is
    measured against, same programs).
    """

    def __init__(
        self, model: Any, tokenizer: Any, *, slots: int = 8, chunk: int = 64, max_waiting: int = 256,
        eos_id: int | None = None, admit: str = "continuous",
    ) -> None:  # fmt: skip
        if admit not in ("continuous", "static"):
            raise ValueError(f"admit={admit!r}; use 'continuous' or 'static'.")
        self.admit = admit
        self.programs = SlotPrograms(model, slots=slots, chunk=min(chunk, model.max_seq_len))
        self.tokenizer = tokenizer
        self.vocab_size = int(model.vocab_size)
        self.eos_id = tokenizer.eos_id if eos_id is None else eos_id
        self.max_waiting = max_waiting
        self.state = self.programs.empty()
        self.slots: list[_Slot | None] = [None] * slots
        self.waiting: collections.deque[Completion] = collections.deque()
        self._sampling = {name: np.zeros(slots, dtype) for name, dtype in _SAMPLING_DTYPES.items()}
        self._sampling["top_p"][:] = 1.0
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self._accepting = True
        self._tokens_total = 0
        self._requests_total = 0
        self._recent: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=1000)
        self._token_times: collections.deque[tuple[float, int]] = collections.deque(maxlen=256)

    @property
    def max_seq_len(self) -> int:
        return self.programs.max_seq_len

    @property
    def capacity(self) -> int:
        """The most requests held at once (every slot and the queue beyond them): a request of
        more choices can never be taken, whatever the wait."""
        return len(self.slots) + self.max_waiting

    # Clients ----------------------------------------------------------------------------------
    def submit(self, request: Request, notify: Any = None) -> Completion:
        """Queues `request`; RequestError (a field out of range), QueueFull or ShuttingDown."""
        request.check(max_seq_len=self.max_seq_len, vocab_size=self.vocab_size)
        completion = Completion(request, notify)
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down; send the request to another replica.")
            free = sum(s is None for s in self.slots)  # the next step admits this many of the waiting
            if len(self.waiting) >= self.max_waiting + free:
                raise QueueFull(retry_after_s=max(1.0, self._expected_wait_s()))
            self.waiting.append(completion)
            self._lock.notify_all()
        return completion

    def stats(self) -> EngineStats:
        with self._lock:
            now = time.perf_counter()
            recent = [(t, n) for t, n in self._token_times if now - t < 10.0]
            rate = sum(n for _, n in recent) / 10.0 if recent else 0.0
            return EngineStats(
                waiting=len(self.waiting), busy=sum(s is not None for s in self.slots), slots=len(self.slots),
                tokens_total=self._tokens_total, requests_total=self._requests_total, tokens_per_s=rate,
                ttft_s=[r[1] for r in self._recent], latency_s=[r[2] for r in self._recent],
            )  # fmt: skip

    # The loop ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Runs steps on a daemon thread until `stop()`."""
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="pax_eqx-engine", daemon=True)
        self._thread.start()

    def stop(self, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stops accepting requests; with `drain`, finishes every queued and running one first
        (SIGTERM), else cancels them."""
        with self._lock:
            self._accepting = False
            if not drain:
                for c in [*self.waiting, *(s.completion for s in self.slots if s)]:
                    c.cancel()
            self._lock.notify_all()
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        while self.busy() and (deadline is None or time.perf_counter() < deadline):
            if self._thread is None:
                self.step()
            else:
                time.sleep(0.01)
        self._running = False
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def busy(self) -> bool:
        with self._lock:
            return bool(self.waiting) or any(s is not None for s in self.slots)

    def _loop(self) -> None:
        while self._running:
            with self._lock:
                while self._running and not self.waiting and all(s is None for s in self.slots):
                    self._lock.wait(timeout=0.5)
            if self._running:
                self.step()

    def step(self) -> None:
        """One round: evict, admit, prefill a chunk per reading slot, generate a token per slot."""
        self._evict_expired()
        self._admit()
        for i, slot in enumerate(self.slots):
            if slot is not None and slot.last < 0:
                self._prefill_chunk(i, slot)
        if any(s is not None and s.last >= 0 for s in self.slots):
            self._generate()

    def _evict_expired(self) -> None:
        now = time.perf_counter()
        for i, slot in enumerate(self.slots):
            if slot is None:
                continue
            c = slot.completion
            if c.cancelled:
                self._finish(i, "cancelled")
            elif now - c.submitted > c.request.timeout_s:
                self._finish(i, "timeout")
        with self._lock:
            keep = collections.deque()
            for c in self.waiting:
                if c.cancelled or now - c.submitted > c.request.timeout_s:
                    reason = "cancelled" if c.cancelled else "timeout"
                    c.put(Finished(reason, "", len(c.request.prompt), 0))
                else:
                    keep.append(c)
            self.waiting = keep

    def _admit(self) -> None:
        if self.admit == "static" and any(s is not None for s in self.slots):
            return
        with self._lock:
            for i in range(len(self.slots)):
                if self.slots[i] is None and self.waiting:
                    c = self.waiting.popleft()
                    self.slots[i] = _Slot(c, TextStream(self.tokenizer, c.request.stop))
                    r = c.request
                    for name, value in (("temperature", r.temperature), ("top_k", r.top_k), ("top_p", r.top_p),
                                        ("seed", r.seed), ("count", 0)):  # fmt: skip
                        self._sampling[name][i] = value

    def _row_sampling(self, rows: slice | int) -> RowSampling:
        take = (lambda a: a[rows : rows + 1]) if isinstance(rows, int) else (lambda a: a[rows])
        return RowSampling(**{name: jnp.asarray(take(a)) for name, a in self._sampling.items()})

    def _prefill_chunk(self, i: int, slot: _Slot) -> None:
        prompt = slot.completion.request.prompt
        chunk = self.programs.chunk
        piece = np.zeros(chunk, np.int32)
        n = min(chunk, len(prompt) - slot.read)
        piece[:n] = prompt[slot.read : slot.read + n]
        self.state, token = self.programs.prefill(
            self.programs.params, self.state, jnp.int32(i), jnp.asarray(piece), jnp.int32(n), jnp.int32(slot.read),
            self._row_sampling(i),
        )  # fmt: skip
        slot.read += n
        if slot.read == len(prompt):
            self._emit(i, int(token))

    def _generate(self) -> None:
        tokens = np.array([s.last if s is not None and s.last >= 0 else 0 for s in self.slots], np.int32)
        active = np.array([s is not None and s.last >= 0 for s in self.slots])
        self.state, new = self.programs.generate(
            self.programs.params, self.state, jnp.asarray(tokens), jnp.asarray(active), self._row_sampling(slice(None))
        )
        new = np.asarray(new)
        for i in np.flatnonzero(active):
            self._emit(int(i), int(new[i]))

    def _emit(self, i: int, token: int) -> None:
        """Token `token` of slot i: ends the request (EOS, a stop string, max_tokens) or sends it."""
        slot = self.slots[i]
        assert slot is not None
        self._sampling["count"][i] += 1
        self._tokens_total += 1
        self._token_times.append((time.perf_counter(), 1))
        if token == self.eos_id:
            self._finish(i, "stop")
            return
        slot.generated += 1
        text, stopped = slot.stream.push(token)
        slot.completion.put(Token(token, text))
        if stopped:
            self._finish(i, "stop", flush=False)
        elif slot.generated >= slot.completion.request.max_tokens:
            self._finish(i, "length")
        else:
            slot.last = token

    def _finish(self, i: int, reason: str, flush: bool = True) -> None:
        slot = self.slots[i]
        assert slot is not None
        c = slot.completion
        if flush and reason in ("stop", "length"):
            rest = slot.stream.finish()
            if rest:
                c.put(Token(-1, rest))  # held-back text, no new token
        c.put(Finished(reason, slot.stream.sent, len(c.request.prompt), slot.generated))  # type: ignore[arg-type]
        now = time.perf_counter()
        with self._lock:
            self.slots[i] = None
            self._requests_total += 1
            first = c.first_token if c.first_token is not None else now
            self._recent.append((now, first - c.submitted, now - c.submitted))

    def _expected_wait_s(self) -> float:
        """Seconds until a queue place frees: the recent mean latency (1 s before any)."""
        latencies = [r[2] for r in self._recent]
        return sum(latencies) / len(latencies) if latencies else 1.0


_SAMPLING_DTYPES = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32, "seed": np.uint32,
                    "count": np.int32}  # fmt: skip
