"""A classifier served: POST /v1/classify answers each example's labels and probabilities.

    POST /v1/classify {"input": [[0.0, 0.5, ...], ...], "top_k": 3}
    -> {"object": "list", "model": ..., "data": [{"index": 0, "label": "7", "probability": 0.91,
        "labels": ["7", "1", "9"], "probabilities": [0.91, 0.05, 0.02]}, ...]}

`input` is one example (nested lists of the model's `input_shape`) or a list of them, numbers as
the model's training inputs were (the digits' pixels scaled as the data source scales them: the
server does not normalise). Labels are the class names given (`labels`), else the class
indices as strings. `top_k` (default: every class, at most 10) is how many of the most likely
labels each answer lists.

The model (`predict(batch) -> (classes, probabilities)`, the classifier families' hook) runs
`batch` examples at a time, the last batch padded, so one program is compiled whatever a request
holds. Requests take turns on one lock; at most `max_waiting` may wait (QueueFull, HTTP 429).
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pax_eqx.layers.base import Context, Mode
from pax_eqx.serving.engine import EngineStats
from pax_eqx.serving.requests import Completion, QueueFull, Request, RequestError, ShuttingDown

MAX_EXAMPLES = 256  # examples of one request
DEFAULT_TOP_K = 10


class ClassifierBackend:
    """`Backend` of a classifier (see the module docstring). input_shape: one example's shape;
    state: the model's non-trainable state (a batch norm's moving statistics: the train state's
    `nt_state`), dtype: the activation dtype, both as the eval step uses them; labels: the class
    names (default "0", "1", ...)."""

    endpoints = frozenset({"classify"})
    tokenizer = None

    def __init__(
        self, model: Any, input_shape: tuple[int, ...], *, state: Any = None, dtype: Any = None,
        labels: list[str] | None = None, batch: int = 8, max_waiting: int = 256,
    ) -> None:  # fmt: skip
        self.input_shape = tuple(int(d) for d in input_shape)
        self.num_classes = int(model.num_classes)
        self.labels = list(labels) if labels is not None else [str(i) for i in range(self.num_classes)]
        if len(self.labels) != self.num_classes:
            raise ValueError(f"{len(self.labels)} labels for a model of {self.num_classes} classes.")
        self.batch, self.max_waiting = batch, max_waiting
        self.max_seq_len = 0
        self.failure: str | None = None
        self.trace_counts: collections.Counter[str] = collections.Counter()
        self._params, self._static = eqx.partition(model, eqx.is_array)
        self._state, self._dtype = state, dtype
        self._program = jax.jit(self._predict)
        self._turn = threading.Lock()
        self._count_lock = threading.Lock()
        self._pending = 0
        self._accepting = True
        self._requests_total = 0
        self._recent: collections.deque[float] = collections.deque(maxlen=1000)

    def room(self, prompt_tokens: int) -> int:
        return 0

    def submit(self, request: Request, notify: Any = None) -> Completion:
        raise NotImplementedError("a classifier answers /v1/classify, not completions")

    def classify(self, body: Any) -> dict[str, Any]:
        """{"data": [...]} for the request `body` (module docstring); RequestError naming the
        field, QueueFull, ShuttingDown. Blocks while earlier requests run (call it off the event
        loop)."""
        examples, top_k = self.parse(body)
        with self._count_lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down; send the request to another replica.")
            if self._pending >= self.max_waiting + 1:  # the one running and the queue beyond it
                raise QueueFull(retry_after_s=max(1.0, self._mean_latency() * self._pending))
            self._pending += 1
        start = time.perf_counter()
        try:
            with self._turn:
                probabilities = self._probabilities(examples)
        finally:
            with self._count_lock:
                self._pending -= 1
                self._requests_total += 1
                self._recent.append(time.perf_counter() - start)
        data = []
        for i, p in enumerate(probabilities):
            order = np.argsort(-p, kind="stable")[:top_k]
            data.append({
                "index": i, "label": self.labels[order[0]], "probability": float(p[order[0]]),
                "labels": [self.labels[c] for c in order], "probabilities": [float(p[c]) for c in order],
            })  # fmt: skip
        return {"object": "list", "data": data}

    def parse(self, body: Any) -> tuple[np.ndarray, int]:
        """(examples [n, *input_shape] float32, top_k) of a request body."""
        if not isinstance(body, dict):
            raise RequestError("body", "the body must be a JSON object with an `input` field.")
        unknown = set(body) - {"input", "top_k", "model", "user"}
        if unknown:
            name = sorted(unknown)[0]
            raise RequestError(name, f"/v1/classify has no field {name!r}; its fields are input, top_k, model, user.")
        if "input" not in body:
            raise RequestError("input", f"input is missing; send one example of shape {self.input_shape} or a list.")
        shape = list(self.input_shape)
        try:
            x = np.asarray(body["input"], dtype=np.float32)
        except (ValueError, TypeError):
            raise RequestError(
                "input",
                f"input is not an array of numbers of shape {shape} (or a list of them): ragged or not numbers.",
            ) from None
        if x.shape == tuple(shape):
            x = x[None]
        if x.shape[1:] != tuple(shape) or x.shape[0] < 1:
            raise RequestError("input", f"input has shape {list(x.shape)}; send one example of shape {shape} or a "
                               f"list of them ([n, {', '.join(map(str, shape))}]).")  # fmt: skip
        if x.shape[0] > MAX_EXAMPLES:
            raise RequestError("input", f"input holds {x.shape[0]} examples; send at most {MAX_EXAMPLES} a request.")
        if not np.all(np.isfinite(x)):
            raise RequestError("input", "input has a NaN or an infinity; send finite numbers.")
        top_k = body.get("top_k")
        if top_k is None:
            top_k = min(self.num_classes, DEFAULT_TOP_K)
        if type(top_k) is not int or not 1 <= top_k <= self.num_classes:
            raise RequestError("top_k", f"top_k={top_k!r}; send a whole number from 1 to {self.num_classes}.")
        return x, top_k

    def _probabilities(self, x: np.ndarray) -> np.ndarray:
        out = []
        for lo in range(0, len(x), self.batch):
            part = x[lo : lo + self.batch]
            padded = np.zeros((self.batch, *self.input_shape), np.float32)
            padded[: len(part)] = part
            out.append(np.asarray(self._program(self._params, self._state, jnp.asarray(padded)))[: len(part)])
        return np.concatenate(out)

    def _predict(self, params: Any, state: Any, inputs: jax.Array) -> jax.Array:
        self.trace_counts["predict"] += 1
        model = eqx.combine(params, self._static)
        _, probabilities = model.predict({"inputs": inputs}, Context(state=state, mode=Mode.EVAL, dtype=self._dtype))
        return probabilities

    def _mean_latency(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else 1.0

    def stats(self) -> EngineStats:
        with self._count_lock:
            return EngineStats(
                waiting=max(self._pending - 1, 0), busy=int(self._pending > 0), slots=1, tokens_total=0,
                requests_total=self._requests_total, tokens_per_s=0.0, ttft_s=list(self._recent),
                latency_s=list(self._recent),
            )  # fmt: skip

    def start(self) -> None:
        """Nothing runs between requests."""

    def stop(self, drain: bool = True, timeout_s: float | None = None) -> None:
        with self._count_lock:
            self._accepting = False
        deadline = math.inf if timeout_s is None else time.perf_counter() + timeout_s
        while self.busy() and time.perf_counter() < deadline:
            time.sleep(0.01)

    def busy(self) -> bool:
        with self._count_lock:
            return self._pending > 0
