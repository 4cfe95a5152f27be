"""Metric functions an eval input declares (`data.eval.metrics`, SeqIO's `metric_fns`).

A name is looked up here, or is a dotted path `package.module.function` to a user's function.
Each metric runs on one of two things:

- **scores** (`kind="scores"`): the eval epoch's per-example outputs, which the model gives
  (`Model.per_example_outputs`; its config lists their keys in `per_example_keys`), with the
  epoch's merged metrics and an `EvalContext` (tokenizer, job dir, step):
  `fn(rows, merged, context) -> {name: float}`.
  `confusion_matrix`, `balanced_accuracy` (a classifier), `bits_per_byte` (a language model).
- **decoded outputs** (`kind="decoded"`): the model's decode of the eval split (greedy or beam
  from `decode.*`) as text against the targets, SeqIO's `fn(targets, predictions) -> {name:
  float}` (a bare float is reported under the function's name). `exact_match`, `bleu` and `chrf`
  (sacrebleu), `rouge` (rouge-score: rouge1, rouge2, rougeL F-measures), and every user
  function. Needs a model that decodes its inputs (a sequence-to-sequence model).

Names are checked when the experiment is (`check_metric_names`): a misspelt one is refused
naming the available ones, before anything runs, and so is one whose package is not installed
(BLEU, chrF and ROUGE come with the `metrics` extra), with the `pip install` that brings it. A
metric the model or the data cannot feed (`unfeedable`: bits per byte of a user's model without
per-example targets, or of token ids without text) is refused when the user names it
(`--data.eval.metrics`, an inert flag), and otherwise -- an experiment's own list meeting another
model or `--data.synthetic` -- skipped, with a line at the start of the run saying so.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.extras import check, require


@dataclass(frozen=True)
class EvalContext:
    """What a score metric may need besides the rows: the tokenizer, where files go (None: not
    this process), the step."""

    tokenizer: Any
    job_dir: Any
    step: int


@dataclass(frozen=True)
class MetricFn:
    """A metric: what it runs on (`kind`), the per-example outputs it reads (`needs`), the
    function (`target`, "module:function", imported when the metric runs) and a line of help."""

    kind: Literal["scores", "decoded"]
    target: str
    needs: tuple[str, ...] = ()
    help: str = ""
    reports: tuple[str, ...] = ()  # the scalar names it adds to the eval's results
    needs_text: bool = False  # counts something of the text (token ids without text cannot feed it)
    package: str = ""  # the package of an optional extra it imports (EXTRA), "" for none

    def function(self) -> Callable:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


_CLASSIFIER = ("predicted", "label", "weight")
REGISTRY: dict[str, MetricFn] = {
    "confusion_matrix": MetricFn(
        "scores", "pax_eqx.programs.evaluate.eval_metrics:confusion_metric", _CLASSIFIER,
        "writes DIR/plots/confusion.png and confusion.json (a classifier)", (),
    ),
    "balanced_accuracy": MetricFn(
        "scores", "pax_eqx.programs.evaluate.eval_metrics:balanced_accuracy_metric", _CLASSIFIER,
        "the mean per-class recall (a classifier)", ("balanced_accuracy",),
    ),
    "bits_per_byte": MetricFn(
        "scores", "pax_eqx.metric_fns:bits_per_byte", ("labels", "token_weights"),
        "the loss in bits per UTF-8 byte of the targets: comparable across tokenizers (a language model)",
        ("bits_per_byte",), needs_text=True,
    ),
    "exact_match": MetricFn(
        "decoded", "pax_eqx.metric_fns:exact_match", (), "the share of outputs equal to the target", ("exact_match",)
    ),
    "bleu": MetricFn(
        "decoded", "pax_eqx.metric_fns:bleu", (), "sacrebleu's corpus BLEU (0-100)", ("bleu",), package="sacrebleu"
    ),
    "chrf": MetricFn(
        "decoded", "pax_eqx.metric_fns:chrf", (), "sacrebleu's corpus chrF (0-100)", ("chrf",), package="sacrebleu"
    ),
    "rouge": MetricFn(
        "decoded", "pax_eqx.metric_fns:rouge", (), "rouge-score's mean rouge1/rouge2/rougeL F (0-100)",
        ("rouge1", "rouge2", "rougeL"), package="rouge_score",
    ),
}  # fmt: skip


def resolve(name: str) -> MetricFn:
    """The registered metric `name`, or a user's decoded-output function at a dotted path;
    ConfigError naming the available metrics otherwise."""
    if name in REGISTRY:
        return REGISTRY[name]
    module, _, function = name.rpartition(".")
    if module:
        try:
            found = getattr(importlib.import_module(module), function, None)
        except ImportError as e:
            raise ConfigError(
                f"data.eval.metrics names {name!r}, whose module {module!r} cannot be imported: {e}."
            ) from None
        if callable(found):
            return MetricFn("decoded", f"{module}:{function}", (), "a user's fn(targets, predictions)", (function,))
        raise ConfigError(f"data.eval.metrics names {name!r}, but {module!r} has no function {function!r}.")
    raise ConfigError(
        f"data.eval.metrics names {name!r}, which is not an eval metric: use one of {sorted(REGISTRY)} or a dotted "
        "path package.module.function to your own fn(targets, predictions) -> {name: float}."
    )


EXTRA = "metrics"
"""The pyproject extra that brings the packages of BLEU, chrF and ROUGE."""


def check_metric_names(names: Sequence[str], skipped: Collection[str] = ()) -> None:
    """ConfigError for a metric that does not exist (naming the available ones); MissingExtraError
    for one whose package is not installed, unless it is `skipped` (a metric this model or data
    cannot feed: `unfeedable`), so the run stops before it starts instead of at its first eval."""
    for name in names:
        metric = resolve(name)
        if metric.package and name not in skipped:
            check(metric.package, EXTRA, _needed_for(name))


def _needed_for(name: str) -> str:
    return f"the eval metric {name!r} (data.eval.metrics)"


def unfeedable(
    names: Sequence[str], per_example_keys: Sequence[str], decodes_inputs: bool, has_text: bool, model: str
) -> dict[str, str]:
    """{metric: why} for the named metrics this model (its per-example outputs, whether it decodes
    its inputs) or this data (text, or token ids without any) cannot feed."""
    why = {}
    for name in names:
        metric = resolve(name)
        if metric.kind == "decoded" and not decodes_inputs:
            why[name] = (
                f"{name!r} scores decoded outputs against targets, but the model ({model}) does not decode its "
                "inputs (a sequence-to-sequence model does)"
            )
        elif any(k not in per_example_keys for k in metric.needs):
            why[name] = (
                f"{name!r} reads the per-example outputs {list(metric.needs)}, but the model ({model}) gives "
                f"{list(per_example_keys)}"
            )
        elif metric.needs_text and not has_text:
            why[name] = f"{name!r} counts the bytes of text, and the data source gives token ids without any"
    return why


# Score-based metrics ---------------------------------------------------------------------------
def bits_per_byte(rows: dict[str, np.ndarray], merged: dict[str, Any], context: EvalContext) -> dict[str, float]:
    """The eval loss in bits per UTF-8 byte of the predicted tokens: sum of -log2 p over the
    weighted targets / the bytes those targets stand for (`tokenizer.token_bytes()`). A
    byte-level model's bits per byte is its loss / ln 2; two models with different tokenizers
    compare on it where their per-token losses do not."""
    token_bytes = np.asarray(context.tokenizer.token_bytes(), np.float64)
    labels, weights = rows["labels"].astype(np.int64), rows["token_weights"].astype(np.float64)
    num_bytes = float(np.sum(token_bytes[labels] * weights))
    nats = float(merged["avg_xent"].value) * float(merged["avg_xent"].weight)
    return {"bits_per_byte": nats / math.log(2) / num_bytes if num_bytes else float("nan")}


# Decoded-output metrics: SeqIO's (targets, predictions) -------------------------------------------
def exact_match(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """The share (0-1) of predictions equal to their target, after stripping outer whitespace."""
    same = [t.strip() == p.strip() for t, p in zip(targets, predictions, strict=True)]
    return {"exact_match": float(np.mean(same)) if same else 0.0}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """sacrebleu's corpus BLEU (13a tokenisation, exp smoothing), one reference per example."""
    sacrebleu = require("sacrebleu", EXTRA, _needed_for("bleu"))
    return {"bleu": float(sacrebleu.corpus_bleu(list(predictions), [list(targets)]).score)}


def chrf(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """sacrebleu's corpus chrF (character 6-grams, beta 2)."""
    sacrebleu = require("sacrebleu", EXTRA, _needed_for("chrf"))
    return {"chrf": float(sacrebleu.corpus_chrf(list(predictions), [list(targets)]).score)}


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """rouge-score's rouge1, rouge2 and rougeL F-measures, averaged over the examples, x 100
    (as SeqIO's t5.evaluation.metrics.rouge reports them)."""
    rouge_scorer = require("rouge_score.rouge_scorer", EXTRA, _needed_for("rouge"))
    kinds = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
    scores = [scorer.score(t, p) for t, p in zip(targets, predictions, strict=True)]
    return {k: 100.0 * float(np.mean([s[k].fmeasure for s in scores])) if scores else 0.0 for k in kinds}


def run_decoded(name: str, targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """A decoded-output metric's scores as {name: float} (a bare float under the metric's last name);
    MetricReturnError saying what it returned when that is neither (`scores_of`)."""
    return scores_of(name, resolve(name).function()(list(targets), list(predictions)))


class MetricReturnError(TypeError):
    """A metric returned something that is not {name: float} or a float (its message says what)."""


def scores_of(name: str, out: Any) -> dict[str, float]:
    """`out`, what the metric `name` returned, as {name: float}: a dict of numbers, or one number
    (reported under the metric's last name). MetricReturnError naming what it is otherwise (text, None, a
    dict holding either): `float("0.5")` would pass a string one run and fail the next."""
    if isinstance(out, dict):
        return {str(k): _number(v, f"{{{k!r}: ...}}") for k, v in out.items()}
    return {name.rsplit(".", 1)[-1]: _number(out, "")}


def _number(value: Any, inside: str) -> float:
    where = f" in {inside}" if inside else ""
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise MetricReturnError(f"returned {_shown(value)}{where}, not a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise MetricReturnError(f"returned {_shown(value)}{where}, not a number") from None


def _shown(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return "None" if value is None else f"{type(value).__name__} {text}"


PROBE_TARGETS = ("the cat sat on the mat",)
PROBE_PREDICTIONS = ("the cat sat on a mat",)
"""One made-up target and prediction: what a user's metric is called on before a run starts
(programs/preflight.py), so a metric that raises, returns text or takes no arguments is refused
before anything is written, not at the first eval."""


def is_user_metric(name: str) -> bool:
    """Whether `name` is a user's function (a dotted path), not a registered metric."""
    return name not in REGISTRY
