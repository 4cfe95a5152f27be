"""An encoder-decoder served (completions only): one request at a time, one compiled program.

The Engine batches decoder-only models (one KV cache, a slot per request); an encoder-decoder
also keeps each request's encoder output, so it is served here one request at a time through the
model's own `SequenceModelDecoder` (the decode CLI's), in a program whose shapes never change:
the input right-padded to `max_seq_len`, the decoder's cache `max_seq_len` long, and a
`lax.while_loop` that stops at the request's `max_tokens` (a traced number) or its EOS. Its
sampling is `row_sampling.choose_rows` with the request's settings as traced values, as the
Engine's, so no request compiles a second program (`trace_counts`).

A prompt is text with T5's sentinels written `<extra_id_N>` (span_corruption's
`encode_with_sentinels`), ending with EOS as the training inputs do; the answer's sentinels are
written back the same way. The whole answer is computed in one call, then streamed a token at a
time through `TextStream` (stop strings). A bounded queue in front (QueueFull -> HTTP 429).
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections import Counter
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pax_eqx.data.span_corruption import decode_with_sentinels, encode_with_sentinels
from pax_eqx.models.sequence_model import SequenceModelDecoder
from pax_eqx.serving.engine import EngineStats
from pax_eqx.serving.requests import Completion, Finished, QueueFull, Request, RequestError, ShuttingDown, Token
from pax_eqx.serving.row_sampling import RowSampling, choose_rows
from pax_eqx.serving.text_stream import TextStream


class SentinelText:
    """The tokenizer as an encoder-decoder's prompts use it: `<extra_id_N>` is sentinel N, a
    prompt ends with EOS; ids up to the model's vocabulary (sentinels included) are valid."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.base = tokenizer
        self.vocab_size = vocab_size
        self.eos_id, self.bos_id, self.pad_id = tokenizer.eos_id, tokenizer.bos_id, tokenizer.pad_id

    def encode(self, text: str) -> list[int]:
        return encode_with_sentinels(self.base, text) + [self.eos_id]

    def decode(self, ids: Any) -> str:
        return decode_with_sentinels(self.base, ids)

    def unknown_characters(self, text: str) -> str:
        """What the tokenizer cannot encode, outside the `<extra_id_N>` markers."""
        return self.base.unknown_characters(re.sub(r"<extra_id_\d+>", "", text))


class Seq2SeqBackend:
    """`Backend` of a SequenceModel (see the module docstring). vocab_size: the model's (the
    tokenizer's plus the sentinels)."""

    endpoints = frozenset({"completions"})

    def __init__(self, model: Any, tokenizer: Any, *, vocab_size: int, max_waiting: int = 256) -> None:
        self.tokenizer = SentinelText(tokenizer, vocab_size)
        self.max_seq_len = int(model.max_seq_len)
        self.max_waiting = max_waiting
        self.failure: str | None = None
        self.trace_counts: Counter[str] = Counter()
        self._params, self._static = eqx.partition(model, eqx.is_array)
        self._program = jax.jit(self._decode)
        self._waiting: collections.deque[Completion] = collections.deque()
        self._running_one = False
        self._lock = threading.Condition()
        self._accepting, self._running = True, False
        self._thread: threading.Thread | None = None
        self._tokens_total = self._requests_total = 0
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=1000)
        self._token_times: collections.deque[tuple[float, int]] = collections.deque(maxlen=256)

    @property
    def capacity(self) -> int:
        """The most requests held at once: the one decoding and the queue."""
        return 1 + self.max_waiting

    # Clients ----------------------------------------------------------------------------------
    def room(self, prompt_tokens: int) -> int:
        """The decoder's cache holds the start token and max_seq_len - 1 new ones; the input
        (EOS included) at most max_seq_len tokens."""
        return self.max_seq_len - 1 if prompt_tokens <= self.max_seq_len else 0

    def submit(self, request: Request, notify: Any = None) -> Completion:
        if len(request.prompt) > self.max_seq_len:
            raise RequestError("prompt", f"the input is {len(request.prompt)} tokens (EOS included); the model reads "
                               f"{self.max_seq_len} at most: shorten it.")  # fmt: skip
        if request.max_tokens > self.room(len(request.prompt)):
            raise RequestError("max_tokens", f"max_tokens={request.max_tokens}; this model writes at most "
                               f"{self.room(len(request.prompt))} tokens: lower it.")  # fmt: skip
        request.check(max_seq_len=len(request.prompt) + request.max_tokens, vocab_size=self.tokenizer.vocab_size)
        completion = Completion(request, notify)
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down; send the request to another replica.")
            if len(self._waiting) >= self.max_waiting + (not self._running_one):  # the queue beyond the one running
                latencies = [r[1] for r in self._recent]
                wait = sum(latencies) / len(latencies) * len(self._waiting) if latencies else 1.0
                raise QueueFull(retry_after_s=max(1.0, wait))
            self._waiting.append(completion)
            self._lock.notify_all()
        return completion

    def classify(self, body: Any) -> dict[str, Any]:
        raise NotImplementedError("an encoder-decoder does not classify")

    def stats(self) -> EngineStats:
        with self._lock:
            now = time.perf_counter()
            rate = sum(n for t, n in self._token_times if now - t < 10.0) / 10.0
            return EngineStats(
                waiting=len(self._waiting), busy=int(self._running_one), slots=1, tokens_total=self._tokens_total,
                requests_total=self._requests_total, tokens_per_s=rate, ttft_s=[r[0] for r in self._recent],
                latency_s=[r[1] for r in self._recent],
            )  # fmt: skip

    # The loop ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="pax_eqx-seq2seq", daemon=True)
        self._thread.start()

    def stop(self, drain: bool = True, timeout_s: float | None = None) -> None:
        with self._lock:
            self._accepting = False
            if not drain:
                for c in self._waiting:
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
            return bool(self._waiting) or self._running_one

    def _loop(self) -> None:
        while self._running:
            with self._lock:
                while self._running and not self._waiting:
                    self._lock.wait(timeout=0.5)
            if self._running:
                self.step()

    def step(self) -> None:
        """Answers the next waiting request (a cancelled or timed-out one ends without running)."""
        with self._lock:
            if not self._waiting:
                return
            c = self._waiting.popleft()
            self._running_one = True
        try:
            self._answer(c)
        except Exception as e:
            self.failure = f"decoding failed: {type(e).__name__}: {e}"
            c.put(Finished("cancelled", "", len(c.request.prompt), 0))
            raise
        finally:
            with self._lock:
                self._running_one = False

    def _answer(self, c: Completion) -> None:
        r = c.request
        if c.cancelled or time.perf_counter() - c.submitted > r.timeout_s:
            c.put(Finished("cancelled" if c.cancelled else "timeout", "", len(r.prompt), 0))
            return
        inputs = np.zeros((1, self.max_seq_len), np.int32)
        paddings = np.ones((1, self.max_seq_len), np.float32)
        inputs[0, : len(r.prompt)], paddings[0, : len(r.prompt)] = r.prompt, 0.0
        sampling = RowSampling(
            temperature=jnp.float32([r.temperature]), top_k=jnp.int32([r.top_k]), top_p=jnp.float32([r.top_p]),
            seed=jnp.asarray([r.seed], jnp.uint32), count=jnp.int32([0]),
        )  # fmt: skip
        out, count = self._program(self._params, jnp.asarray(inputs), jnp.asarray(paddings), sampling,
                                   jnp.int32(r.max_tokens), jnp.int32(self.tokenizer.eos_id))  # fmt: skip
        tokens = np.asarray(out)[: int(count)].tolist()
        stream, reason, generated, stopped = TextStream(self.tokenizer, r.stop), "length", 0, False
        for token in tokens:
            if token == self.tokenizer.eos_id:
                reason = "stop"
                break
            generated += 1
            text, stopped = stream.push(token)
            c.put(Token(token, text))
            if stopped:
                reason = "stop"
                break
        rest = "" if stopped else stream.finish()  # held-back text, unless a stop string ended it
        if rest:
            c.put(Token(-1, rest))
        c.put(Finished(reason, stream.sent, len(r.prompt), generated))  # type: ignore[arg-type]
        now = time.perf_counter()
        with self._lock:
            self._tokens_total += len(tokens)
            self._requests_total += 1
            self._token_times.append((now, len(tokens)))
            first = c.first_token if c.first_token is not None else now
            self._recent.append((first - c.submitted, now - c.submitted))

    def _decode(self, params, inputs, paddings, sampling: RowSampling, max_tokens, eos_id):
        """Up to `max_tokens` new tokens of one input [1, max_seq_len], stopping after EOS:
        (tokens [max_seq_len - 1], how many were drawn)."""
        self.trace_counts["decode"] += 1
        model = eqx.combine(params, self._static)
        new = self.max_seq_len - 1
        decoder = SequenceModelDecoder(model, inputs, paddings, max_new_tokens=new, start_id=self.tokenizer.bos_id)
        logits, carry = decoder.start()

        def body(state):
            t, logits, carry, out, _ = state
            token = choose_rows(logits, eqx.tree_at(lambda s: s.count, sampling, t[None]))
            logits, carry = decoder.extend(token, carry, t)
            return t + 1, logits, carry, out.at[t].set(token[0]), token[0] == eos_id

        def more(state):
            t, _, _, _, done = state
            return (t < max_tokens) & ~done

        state = (jnp.int32(0), logits, carry, jnp.zeros((new,), jnp.int32), jnp.bool_(False))
        t, _, _, out, _ = jax.lax.while_loop(more, body, state)
        return out, t
