"""What is checked before compile, and why: the inputs a run would otherwise meet only mid-run.

`ExperimentConfig.validate` checks the configs (also for a --dry-run, which reads no data). The
checks here read files or run the user's code, so they run once per program, after validate and
before the job dir is made, locked or written (train: pax_eqx/train.py; eval and decode:
programs/restore.py): a refused start writes nothing, exit 2 with one line. Each was found
before only after the compile -- at the first eval, losing that step's checkpoint, or as a NaN
loss whose error suggests lowering the learning rate.

What, why (what happened before) and what it costs:

- Each user metric (`data.eval.metrics` naming `package.module.function`) is called once on one
  made-up target and prediction (metric_fns.PROBE_*). One that raised, returned text or None,
  or took no arguments stopped the first eval with a traceback, and that step's checkpoint was
  never written. Cost: the function's, once.
- The eval split's encoded images (imagenet_folder, imagenet_array_record:
  `DataSource.check_decodable`). A zero-byte or unreadable validation JPEG stopped the first
  eval. The rule: every file's size (one stat, ~4 us), then every image decoded when the split
  holds <= 500 (imagenet_source.DECODE_ALL_UP_TO), else 500 spread evenly (first and last
  included). Measured on this 2-core VM: 3.6 ms per 500x375 JPEG on one core, 2.2 ms with
  both, so at most ~2 s (ImageNet's 50,000 validation images whole: ~3 min, hence the sample);
  the tests' 6 tiny JPEGs take a few ms.
- The tokenizer's ids -- its largest, its pad/bos/eos, span corruption's sentinels -- below
  model.vocab_size (data.build.check_token_ids). An id without an embedding row gave a NaN
  loss, blamed on the learning rate; a tokenizer.json whose vocabulary skips ids passed the
  count check. Cost: loading the tokenizer (one still to be trained into the job dir is not
  trained here: its configured size is checked).
- LoRA's base (`lora.base_job_dir`): a directory with config.json and a committed checkpoint
  (the `lora.base_step` asked for), whole weights, this model's parameter names and shapes
  (lora_base.check_base). A bad base was refused after `Starting ...`, leaving an empty job
  dir, and a relative path met orbax's raw `Checkpoint path should be absolute`. Cost: two
  abstract inits (jax.eval_shape): no array is made or read.

Checked by validate instead (config only): `model.num_classes >= 2`, and a classifier's classes
against the data's where the config or the data's class folders / manifest say them
(ClassificationModelConfig.check_data).

Still found only when read: a file of the train split (a failing batch stops the run with the
checkpoints written before intact), an image of a large eval split outside the sample, and a
user metric that fails only on some outputs (a warning; its scores are NaN in that eval, and the
run goes on: programs/evaluate/decoded_eval.py).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.data import build_tokenizer
from pax_eqx.data.build import check_token_ids
from pax_eqx.data.tokenizers import SPM_DIRNAME, SPM_FILENAME
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.job.errors import raised_at
from pax_eqx.metric_fns import PROBE_PREDICTIONS, PROBE_TARGETS, MetricReturnError, is_user_metric, resolve, scores_of
from pax_eqx.programs import lora_base


def check(exp: ExperimentConfig, job_dir: Path, *, evaluates: bool = True) -> None:
    """Every check of the module doc that applies to a program over `job_dir` (which need not
    exist yet); `evaluates`: the program runs evals (train, eval; not decode)."""
    job_dir = Path(job_dir)
    check_token_ids_before_compile(exp, job_dir)
    if exp.lora.enabled:
        lora_base.check_base(exp, job_dir)
    if evaluates:
        check_user_metrics(exp)
        exp.data.source.check_decodable(exp.data, "eval")


def check_trainable(exp: ExperimentConfig) -> None:
    """A materialized model (quantization int: integers and scales) has no gradient: refused
    before a train run writes anything, naming the field."""
    if exp.quantization.kind == "int":
        raise ConfigError(
            "quantization=int: this experiment is a materialized model (integers and scales, written by python -m "
            "pax_eqx.quantize), which has no gradient; train the float model (--quantization fake_quant for "
            "quantization-aware training, or none) and quantize it after."
        )


def check_token_ids_before_compile(exp: ExperimentConfig, job_dir: Path) -> None:
    """The tokenizer's ids against model.vocab_size, with the tokenizer the run will use. One
    that would be trained into the job dir (SentencePiece without a model_path) is not trained
    here: it will have its configured size."""
    vocab = exp.model.token_vocab_size()
    if vocab is None or not exp.data.source.reads_tokens:
        return
    tok = exp.data.tokenizer
    trained = tok.kind == "sentencepiece" and not tok.model_path and exp.data.source.trains_tokenizer
    if trained and not _found(job_dir / SPM_DIRNAME / SPM_FILENAME):
        added = exp.data.source.added_token_ids(exp.data.seq_len)
        if tok.model_type != "char" and tok.vocab_size + added > vocab:  # a char model may come out smaller
            extra = f" plus {added} span-corruption sentinels" if added else ""
            raise ConfigError(
                f"data.tokenizer.vocab_size={tok.vocab_size}{extra} but model.vocab_size={vocab}: the tokenizer "
                "trained for this run would give ids without an embedding row; set model.vocab_size >= "
                f"{tok.vocab_size + added} or a smaller data.tokenizer.vocab_size."
            )
        return
    check_token_ids(exp.data, build_tokenizer(exp.data, job_dir if _found(job_dir) else None), vocab)


def _found(path: Path) -> bool:
    """Whether `path` exists; False for one the OS refuses to look up (a name too long), which the
    job dir's own checks name when the program makes or opens it (job/job_dir.py)."""
    try:
        return path.exists()
    except OSError:
        return False


def check_user_metrics(exp: ExperimentConfig) -> None:
    """Each user metric the eval will run, called once on one made-up pair (module doc)."""
    unfed = exp.unfed_metrics()  # skipped by the eval: not run, so not probed
    for name in exp.data.eval.metrics:
        if is_user_metric(name) and name not in unfed:
            probe_metric(name)


def probe_metric(name: str) -> dict[str, float]:
    """The scores of the metric `name` on one made-up target and prediction; ConfigError naming
    the metric, what it did and the fix when it cannot be called so, raises, or returns something
    other than {name: float} or a float."""
    fn = resolve(name).function()
    targets, predictions = list(PROBE_TARGETS), list(PROBE_PREDICTIONS)
    shape = "a metric is fn(targets, predictions), two lists of strings, returning {name: float} or a float"
    try:
        signature: Any = inspect.signature(fn)
        signature.bind(targets, predictions)
    except TypeError:
        raise ConfigError(
            f"data.eval.metrics: {name!r} cannot be called as fn(targets, predictions): it is "
            f"{getattr(fn, '__name__', name)}{signature}; {shape}."
        ) from None
    except ValueError:  # no signature to read (a builtin): the call below says
        pass
    called = f"on one made-up pair (targets {targets}, predictions {predictions}) before the run"
    try:
        out = fn(targets, predictions)
    except Exception as e:  # noqa: BLE001 -- the user's code: whatever it raises is the message
        raise ConfigError(
            f"data.eval.metrics: {name!r} raised {type(e).__name__}: {' '.join(str(e).split())}{raised_at(e)} "
            f"{called}; fix it: {shape}."
        ) from None
    try:
        return scores_of(name, out)
    except MetricReturnError as e:
        raise ConfigError(f"data.eval.metrics: {name!r} {e} {called}; {shape}.") from None
