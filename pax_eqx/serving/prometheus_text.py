"""GET /metrics: the engine's numbers in Prometheus' text exposition format (version 0.0.4).

    pax_eqx_queue_depth 3                       gauge: requests waiting for a slot
    pax_eqx_slots_busy 8 / pax_eqx_slots 8      gauges: slots decoding / all
    pax_eqx_tokens_per_second 412.5             gauge: tokens generated over the last 10 s
    pax_eqx_generated_tokens_total 10234        counter
    pax_eqx_requests_total 311                  counter: requests finished (any reason)
    pax_eqx_http_responses_total{code="429"} 2  counter: answers by HTTP status
    pax_eqx_time_to_first_token_seconds{quantile="0.5"} 0.041
    pax_eqx_request_latency_seconds{quantile="0.99"} 1.93

The two times are summaries of the last (up to) 1000 finished requests (EngineStats' window):
quantiles 0.5, 0.9 and 0.99, without `_sum` and `_count` (which Prometheus wants cumulative since
the start, and a window is not). Written by hand: the format is a few lines, and
prometheus_client's registry is process-global (two apps in one process, as in the tests, would
share it).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pax_eqx.serving.engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUANTILES = (0.5, 0.9, 0.99)


def metrics_text(stats: EngineStats, responses: Mapping[int, int] | None = None, prefix: str = "pax_eqx") -> str:
    """The exposition text of `stats` and the count of answers by HTTP status (`responses`)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float | int]]) -> None:
        lines.append(f"# HELP {prefix}_{name} {help_}")
        lines.append(f"# TYPE {prefix}_{name} {kind}")
        lines.extend(f"{prefix}_{name}{labels} {_number(value)}" for labels, value in samples)

    metric("queue_depth", "gauge", "Requests waiting for a decode slot.", [("", stats.waiting)])
    metric("slots_busy", "gauge", "Decode slots holding a request.", [("", stats.busy)])
    metric("slots", "gauge", "Decode slots (requests decoded at once).", [("", stats.slots)])
    metric("tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.", [("", stats.tokens_per_s)])
    metric("generated_tokens_total", "counter", "Tokens generated since the start.", [("", stats.tokens_total)])
    metric("requests_total", "counter", "Requests finished since the start (any reason).", [("", stats.requests_total)])
    if responses is not None:
        metric(
            "http_responses_total", "counter", "HTTP answers by status code since the start.",
            [(f'{{code="{code}"}}', count) for code, count in sorted(responses.items())],
        )  # fmt: skip
    for name, values, what in (
        ("time_to_first_token_seconds", stats.ttft_s, "Seconds from a request's arrival to its first token"),
        ("request_latency_seconds", stats.latency_s, "Seconds from a request's arrival to its end"),
    ):
        qs = np.quantile(np.asarray(values), QUANTILES) if values else [float("nan")] * len(QUANTILES)
        metric(name, "summary", f"{what}, over the last {len(values)} finished requests.",
               [(f'{{quantile="{q}"}}', v) for q, v in zip(QUANTILES, qs)])  # fmt: skip
    return "\n".join(lines) + "\n"


def _number(value: float | int) -> str:
    """Prometheus' spelling: integers as such, NaN and the infinities by name."""
    value = float(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
