"""Every flag of the sections around the model takes effect: data, task, mesh, decode, train,
checkpoint and profile (tests/test_every_flag_takes_effect.py walks the model and the learner).

For every leaf field, the walk changes the field and compares one cheap observable of its section:

- data: the batches the model is fed: the first train batches, and two eval runs read as the eval
  loop reads them (for every registered experiment's data, its files replaced by tiny ones);
- task: the jaxpr and the values of one train step of a tiny model;
- mesh: the mesh's shape and the partition spec of every leaf of the train state;
- decode: the text a tiny model samples or beam-searches from the prompt;
- train, checkpoint, profile: a whole tiny run, in this process: the records of metrics.jsonl
  (timings dropped), the steps whose checkpoints remain, what the run printed (timings dropped)
  and the files it wrote.

A choice of these sections (`data.source`, `data.tokenizer`, `decode.strategy`) is switched to
each of its other variants, which must change the observable or be refused; the fields of a
variant no experiment chooses (`--data.source text_files`, `--decode.strategy beam`) are walked
on the first experiment that takes the switch.

A change must alter the observable, or be refused at start: by the inert-flag check (the flag
names a field a config lists in `inert_fields`) or by validation with an error naming the field.
The few fields that change nothing here by design are in `NO_EFFECT_HERE`, each with its
reason, and `test_what_is_listed_as_without_effect_here_has_none` checks that each still has
none: an entry cannot hide a field that started to matter, or outlive its field.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from config_walk import arrays_digest, digest, field_type, leaf_paths, new_values
from event_files import scalar_tags

from experiments import registry
from pax_eqx.command_line.choices import choice_fields
from pax_eqx.command_line.inert_flags import InertFlagError, refuse_inert_flags
from pax_eqx.config import config, field_names, switch_variant
from pax_eqx.data import (
    DataConfig,
    GeneratedExamples,
    build_input,
    build_tokenizer,
)
from pax_eqx.data.input_config import eval_num_batches
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.programs.decode.example_decoding import decode_records
from pax_eqx.programs.decode.sampling import prompt_texts
from pax_eqx.programs.decode.seq2seq_decoding import print_seq2seq
from pax_eqx.programs.runtime import Runtime, build_task
from pax_eqx.programs.train.train_loop import train
from pax_eqx.tasks.task import Task

BASE = "shakespeare_char"
SECTIONS = ("data", "task", "mesh", "decode", "train", "checkpoint", "profile", "lora", "quantization")

NO_EFFECT_HERE = {
    "train.steps_per_loop": "how many steps one compiled call runs: the same run, fewer dispatches "
    "(tests/programs/test_steps_per_loop.py compares the two)",
    "checkpoint.async_save": "whether a checkpoint is written in a background thread: the same files",
    "checkpoint.allow_config_change": "read when a job dir is resumed with another config "
    "(tests/programs/test_cli_end_to_end.py resumes one)",
    "data.train.num_workers": "grain worker processes: the same batches, made in parallel",
    "data.train.read_threads": "grain read threads: the same batches, read ahead",
    "data.eval.num_workers": "grain worker processes: the same batches, made in parallel",
    "data.eval.read_threads": "grain read threads: the same batches, read ahead",
    "mesh.device_kind": "the accelerator the layout was written for: read by --dry-run's verdict and --recommend "
    "(tests/named_experiments/test_paxml_plans.py); a run uses the devices it has",
}

# Values tried for fields whose generic perturbation is no use here.
VALUES = {
    "checkpoint.every_n_seconds": [1e-9],  # every step: deterministic, unlike a wall-clock interval
    "checkpoint.max_to_keep": [1],
    "checkpoint.init_from_checkpoint_rules": [None],  # set below: a rule naming a job dir that does not exist
    "profile.steps": [(2, 3)],
    "train.early_stopping.metric": ["eval/loss"],
    "decode.prompt": ["JULIET:"],
    "data.tokenizer.max_training_chars": [10_000],  # half of CORPUS
    "decode.strategy.top_k": [2],
    # The mesh must cover the 8 devices: fsdp or tensor parallel instead of data parallel, and a
    # DCN shape that multiplies the devices (refused). (1, 1, 1, 1), the generic try, is an alias
    # of (1, 1, 1): a stage axis of 1.
    "mesh.ici_mesh_shape": [(4, 2, 1), (2, 1, 4)],
    "mesh.dcn_mesh_shape": [(2, 1, 1)],
    "mesh.device_kind": ["tpu_v5e"],
    "data.train.num_infeed_hosts": [2],
    "data.eval.num_infeed_hosts": [2],
    "data.train.infeed_host_index": [1],
    "data.eval.infeed_host_index": [1],
}


def _tiny(exp: ExperimentConfig) -> ExperimentConfig:
    """`exp` small enough to train, evaluate and sample in seconds."""
    for path, value in {
        "model.num_layers": 1, "model.model_dims": 16, "model.hidden_dims": 32, "model.num_heads": 2,
        "model.max_seq_len": 16, "data.seq_len": 16, "data.train.batch_size": 8, "data.eval.batch_size": 8,
        "data.eval.eval_loop_num_batches": 2, "train.num_steps": 6, "train.eval_interval_steps": 3,
        "train.summary_interval_steps": 2, "train.steps_per_loop": 1, "checkpoint.every_n_steps": 3,
        "decode.max_new_tokens": 4, "mesh.ici_mesh_shape": (jax.device_count(), 1, 1),
    }.items():  # fmt: skip
        exp = exp.override(path, value)
    return exp


@functools.cache
def _base() -> ExperimentConfig:
    return _tiny(registry.load_experiment(BASE))


# One experiment per other model family, walked on the sections whose observables differ by
# family (the task's step, the mesh's shardings, what decode prints); the run sections' whole
# tiny runs stay on the base (the train loop does not look at the model's family).
REPRESENTATIVES = {
    "digits_mlp": {"model.network.hidden_dims": (16,), "data.train.batch_size": 16, "data.eval.batch_size": 16},
    "shakespeare_span_corruption": {
        "model.num_encoder_layers": 1, "model.num_decoder_layers": 1, "model.model_dims": 16,
        "model.hidden_dims": 32, "model.num_heads": 2, "data.seq_len": 32, "data.train.batch_size": 8,
        "data.eval.batch_size": 8, "data.eval.eval_loop_num_batches": 1, "decode.max_new_tokens": 4,
        "decode.num_samples": 2,
    },
}  # fmt: skip
REPRESENTED = ("task", "mesh", "decode")


@functools.cache
def _experiment(name: str) -> ExperimentConfig:
    """The base, or a representative made tiny (data parallel over this process's devices)."""
    if name == BASE:
        return _base()
    exp = registry.load_experiment(name).override("mesh.ici_mesh_shape", (jax.device_count(), 1, 1))
    for path, value in REPRESENTATIVES[name].items():
        exp = exp.override(path, value)
    return exp


# The observables -------------------------------------------------------------------------------
def _batches_digest(batches: list[dict]) -> str:
    return digest(*(arrays_digest({k: np.asarray(v) for k, v in sorted(b.items())}) for b in batches))


def data_observable(exp: ExperimentConfig) -> str:
    """The first train batches, and two eval runs as `eval_loop.evaluate` reads them."""
    with tempfile.TemporaryDirectory() as job_dir:
        tokenizer = build_tokenizer(exp.data, job_dir)
        train_input = build_input(exp.data, "train", tokenizer)
        seen = [_batches_digest([train_input.get_next() for _ in range(8)])]
        eval_input, limit = build_input(exp.data, "eval", tokenizer), eval_num_batches(exp.data.eval)
        for _ in range(2):
            if exp.data.eval.reset_for_eval:
                eval_input.reset()
            run = []
            while len(run) < (limit or 400):
                try:
                    run.append(eval_input.get_next())
                except StopIteration:
                    break
            seen.append(_batches_digest(run))
        return digest(*seen)


def _first_batch(exp: ExperimentConfig) -> dict:
    tokenizer = build_tokenizer(exp.data)
    return {k: np.asarray(v) for k, v in build_input(exp.data, "train", tokenizer).get_next().items()}


def task_observable(exp: ExperimentConfig) -> str:
    """One train step of the tiny model as a closed computation: its jaxpr, the constants it
    closes over, and the state and batch it is applied to. Those determine everything the step
    computes, so it is not compiled and run: a compile per field was most of the walk's time."""
    task = build_task(exp)
    state = task.init_state(jax.random.PRNGKey(0))
    batch = _first_batch(exp)
    step = jax.make_jaxpr(task.train_step)(state, batch)
    text = re.sub(r" at 0x[0-9a-f]+", "", str(step))
    return digest(text, arrays_digest(step.consts), arrays_digest((state, batch)))


def mesh_observable(exp: ExperimentConfig) -> str:
    """The mesh's axes and sizes, and every state leaf's partition spec."""
    with tempfile.TemporaryDirectory() as job_dir:
        programs = Runtime.create(exp, Path(job_dir)).programs
    specs = jax.tree.map(lambda s: str(s.spec), programs.state_shardings)
    return digest(dict(programs.mesh.shape), jax.tree.leaves(specs), jax.tree.structure(specs))


DECODE_SHARPNESS = 4.0
"""The tiny model's parameters are multiplied by this before decoding: an untrained model's
next-token distribution is nearly uniform, under which temperature, top-k or top-p change no
sample (the Gumbel noise decides alone); scaled, its logits spread over a few nats."""


@functools.cache
def _decoder(name: str) -> tuple[Runtime, Any]:
    """The tiny model of experiment `name` (the base or a representative), sharpened."""
    job_dir = tempfile.mkdtemp()
    rt = Runtime.create(_experiment(name), Path(job_dir))
    state = rt.programs.init_state(0)
    sharp = jax.tree.map(lambda p: p * DECODE_SHARPNESS if jnp.issubdtype(p.dtype, jnp.floating) else p, state.params)
    return rt, eqx.tree_at(lambda s: s.params, state, sharp)


def decoded(exp: ExperimentConfig) -> list:
    """What the decode program shows for exp.decode: a classifier's records, an encoder-decoder's
    outputs for its eval examples (or a prompt), a language model's samples or beams."""
    rt, state = _decoder(exp.name)
    if exp.model.decodes_examples:
        return decode_records(rt, state, exp.decode)
    if exp.model.decodes_inputs:  # what it prints: every beam with its score, not the best alone
        lines = []
        print_seq2seq(rt, state, exp.decode, log=lines.append)
        return lines
    return prompt_texts(rt, state, exp.decode)  # samples, or a beam's n-best list with its scores


def decode_observable(exp: ExperimentConfig) -> str:
    """What the tiny (untrained, seeded, sharpened) model decodes for exp.decode."""
    return digest(decoded(exp))


@pytest.fixture(autouse=True, scope="module")
def _plots_as_names():
    """Each tiny run draws its plots at every eval: half its time, and no part of what the walk
    compares (the plots are drawn from metrics.jsonl, which it compares; tests/summaries checks
    the drawing). Here a run writes the plot folder's name only."""
    from pax_eqx.programs.train import train_loop

    def names_only(job_dir):
        (Path(job_dir) / "plots").mkdir(exist_ok=True)
        (Path(job_dir) / "plots" / "drawn").touch()
        return []

    drawn, train_loop.write_plots = train_loop.write_plots, names_only
    yield
    train_loop.write_plots = drawn


@pytest.fixture(autouse=True, scope="module")
def _sentencepiece_trained_once():
    """A data field's observable builds the experiment's tokenizer, and a SentencePiece one is
    trained on the text each time (4 s on the plays): 40 trainings of 8 distinct (config, text)
    pairs. Training is deterministic for a fixed thread count, so a second training of the same
    text and config is served the first's model, as bytes identical as a retraining would give."""
    from pax_eqx.data import tokenizers

    trained: dict = {}
    train = tokenizers.train_sentencepiece

    def once(lines, cfg):
        used = tokenizers.training_sentences(lines, cfg.max_training_chars)  # selecting them again keeps them
        key = (cfg, digest(used))
        if key not in trained:
            trained[key] = train(used, cfg)
        return trained[key]

    tokenizers.train_sentencepiece = once
    yield
    tokenizers.train_sentencepiece = train


@pytest.fixture(autouse=True, scope="module")
def _programs_built_once():
    """Most fields of the run sections change what the loop does around the same compiled
    programs, yet each tiny run would trace and lower its train, eval and decode steps again: two
    thirds of its time. Here the Task and its `Programs` are built once per distinct set of the
    arguments they are built from (Task's configs, dtype and verbosity; the mesh and its rules),
    so a field that reaches them (a learner schedule through train.num_steps, lora.rank,
    train.layer_summaries) still gets a Task and programs of its own, and one that does not reuses
    them as a second identical build would compute them."""
    from pax_eqx.programs import runtime

    def once(make):
        built: dict = {}

        def cached(*args, **kwargs):
            key = (tuple(id(a) if isinstance(a, Task) else a for a in args), tuple(sorted(kwargs.items())))
            if key not in built:
                built[key] = make(*args, **kwargs)
            return built[key]

        return cached

    originals = runtime.Task, runtime.LoraTask, runtime.Programs
    runtime.Task, runtime.LoraTask, runtime.Programs = map(once, originals)
    yield
    runtime.Task, runtime.LoraTask, runtime.Programs = originals


_TIMING_KEYS = {"tokens_per_s", "examples_per_s", "steps_per_s", "time", "elapsed_s"}
_TIMED_LINE = re.compile(r"tok/s|tokens/s|wall|ETA|compil")


def run_observable(exp: ExperimentConfig) -> str:
    """A whole tiny run: metrics.jsonl without timings, the checkpoints left, what it printed
    (lines with timings dropped, the job dir's path replaced), the top-level names of what it
    wrote (not deeper: event and trace files are named by time and host) and the scalar tags of
    its TensorBoard summaries."""
    with tempfile.TemporaryDirectory() as d:
        job_dir, lines = Path(d), []
        train(exp, job_dir, log=lines.append)
        records = []
        for line in (job_dir / "metrics.jsonl").read_text().splitlines():
            record = {k: v for k, v in json.loads(line).items() if k not in _TIMING_KEYS}
            records.append({k: round(v, 5) if isinstance(v, float) else v for k, v in record.items()})
        kept = sorted(p.name for p in (job_dir / "checkpoints").iterdir())
        printed = [ln.replace(d, "DIR") for ln in lines if not _TIMED_LINE.search(ln)]
        written = sorted({p.relative_to(job_dir).parts[0] for p in job_dir.rglob("*") if p.is_file()})
        tags = [sorted(scalar_tags(job_dir / "summaries" / split)) for split in ("train", "eval")]
        return digest(records, kept, printed, written, tags)


BY_A_RUN = {"data.eval.metrics"}
"""Data fields the batches do not show: what the eval scores. Walked on the base experiment's run."""

OBSERVABLES = {
    "data": data_observable,
    "task": task_observable,
    "mesh": mesh_observable,
    "decode": decode_observable,
    "train": run_observable,
    "checkpoint": run_observable,
    "profile": run_observable,
    "lora": run_observable,
    "quantization": task_observable,
}


@functools.cache
def _baseline(section: str, exp: ExperimentConfig) -> str:
    return OBSERVABLES[section](exp)


# The walk --------------------------------------------------------------------------------------
def _values(exp: ExperimentConfig, path: str) -> list[Any]:
    if path == "checkpoint.init_from_checkpoint_rules":
        from pax_eqx.checkpoint.config import InitFromCheckpointConfig

        return [(InitFromCheckpointConfig(job_dir="/nonexistent/job_dir", rules=(("(.*)", "{0}"),)),)]
    if path == "decode.eos_id" and not exp.model.decodes_examples:  # the first token decoded: it must end there
        rt, state = _decoder(exp.name)
        if exp.model.decodes_inputs:
            return [_first_decoded(rt, state, exp)]
        text, _ = decoded(exp)[0]
        return [rt.tokenizer.encode(text)[len(rt.tokenizer.encode(exp.decode.prompt))]]  # an LM echoes its prompt
    if path in VALUES:
        return VALUES[path]
    tp, value = field_type(exp, path)
    return new_values(tp, value)


def _first_decoded(rt: Runtime, state: Any, exp: ExperimentConfig) -> int:
    """The first token an encoder-decoder's decode writes for its first input (the ids, not the
    text: sentinels and bytes do not round-trip through text)."""
    from pax_eqx.programs.decode.seq2seq_decoding import decode_rows, source_rows

    cfg = exp.decode.replace(eos_id=rt.tokenizer.eos_id)
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    rows = [r for r, _ in source_rows(rt, cfg)]
    tokens, _, beams = decode_rows(model, rows, cfg, rt.tokenizer.pad_id, rt.tokenizer.bos_id)
    first = np.asarray(beams.tokens[0, 0] if beams is not None else tokens[0])
    return int(first[0])


def _refused(exp: ExperimentConfig, path: str) -> str | None:
    """The reason `--path` is refused at start on `exp` (as inert: a decode field the strategy or
    the model's decoding does not read is listed so; or by validation), else None."""
    try:
        refuse_inert_flags(exp, ["--" + path])
        if path.startswith("data."):  # what reads the data: the experiment's mesh may want 1,024 devices
            exp.data.validate()
            exp.model.check_data(exp.data)
        else:
            exp.validate(num_devices=jax.device_count())
    except InertFlagError as error:
        return str(error)
    except ValueError as error:  # ConfigError is one
        field = path.rsplit(".", 1)[-1]
        assert re.search(rf"\b{field}\b", str(error)), (
            f"--{path} was refused by an error that does not name it: {error}"
        )
        return str(error)
    return None


def check_takes_effect(exp: ExperimentConfig, path: str) -> str:
    """Some new value of `path` changes its section's observable, or every one is refused; says
    which (the value that took effect, or the refusals)."""
    section = "train" if path in BY_A_RUN else path.split(".", 1)[0]
    refusals = []
    for new in _values(exp, path):
        try:
            changed = exp.override(path, new)
        except ValueError as error:  # the field's own validation
            refusals.append(str(error))
            continue
        reason = _refused(changed, path)
        if reason:
            refusals.append(reason)
            continue
        try:
            observed = OBSERVABLES[section](changed)
        except ValueError as error:  # refused when the run starts
            assert re.search(rf"\b{path.rsplit('.', 1)[-1]}\b", str(error)), (
                f"--{path} {new!r} failed at start with an error that does not name it: {error}"
            )
            refusals.append(str(error))
            continue
        assert observed != _baseline(section, exp), (
            f"--{path} {new!r} (was {field_type(exp, path)[1]!r}) was accepted and changed nothing the "
            f"{section} section does. Refuse it in inert_fields or validate, or make it take effect."
        )
        return f"{path}={new!r} took effect"
    assert refusals, f"no value to try for {path}"
    return f"{path}: refused: " + " | ".join(refusals)


def _section_paths(exp: ExperimentConfig, section: str) -> list[str]:
    return [f"{section}.{p}" for p in leaf_paths(getattr(exp, section))]


def _base_cases() -> list:
    exp = _base()
    return [
        pytest.param(path, id=path)
        for section in SECTIONS
        for path in _section_paths(exp, section)
        if (section != "data" or path in BY_A_RUN) and path not in NO_EFFECT_HERE
    ]


CORPUS = Path(__file__).parent / "fixtures" / "corpus" / "docs.jsonl"
"""60 short documents (A Midsummer Night's Dream) standing in for an experiment's corpus (C4)."""


@functools.cache
def _walk_files() -> dict[str, str]:
    """{source kind: the file this walk gives it}: `CORPUS` for the sources of documents, and
    CORPUS's documents cut in two as (inputs, targets) pairs for seq2seq_jsonl. Sources of other
    files (a prepared corpus, images) are walked in tests/data."""
    where = Path(tempfile.mkdtemp(prefix="pax_eqx_walk_"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    pairs = where / "pairs.jsonl"
    with pairs.open("w") as out:
        for line in CORPUS.read_text().splitlines():
            text = json.loads(line)["text"]
            out.write(json.dumps({"inputs": text[: len(text) // 2], "targets": text[len(text) // 2 :]}) + "\n")
    return {"jsonl": str(CORPUS), "text_files": str(CORPUS), "seq2seq_jsonl": str(pairs)}


def _tiny_data(exp: ExperimentConfig) -> ExperimentConfig:
    """`exp` reading a few small batches: its files replaced by this walk's, its synthetic set cut to
    a few examples (so an epoch ends within the batches read), a SentencePiece vocabulary the
    small corpus can train, from a small part of the text."""
    data, source = exp.data, exp.data.source
    # Span corruption needs rows long enough for more than one noise span (one span's place is fixed).
    seq_len = min(data.seq_len, 64 if getattr(source, "layout", "") == "span_corruption" else 16)
    over = {"data.train.batch_size": 2, "data.eval.batch_size": 2, "data.seq_len": seq_len}
    if data.eval.eval_loop_num_batches:
        over["data.eval.eval_loop_num_batches"] = 2
    if source.kind in _walk_files():
        over["data.source"] = source.replace(path=_walk_files()[source.kind], eval_path="")
    if getattr(source, "target_seq_len", 0):
        over["data.source.target_seq_len"] = min(source.target_seq_len, 8)
    if isinstance(source, GeneratedExamples):
        over["data.source.num_synthetic_examples"] = 6
    if data.tokenizer.kind == "sentencepiece":  # trained on 200k characters (the plays: 14 s on all 5 MB)
        over["data.tokenizer.vocab_size"] = 400
        over["data.tokenizer.max_training_chars"] = min(data.tokenizer.max_training_chars, 200_000)
    for path, value in over.items():
        exp = exp.override(path, value)
    return exp


@functools.cache
def _data_configs() -> dict[str, ExperimentConfig]:
    """{the first experiment's name: its tiny data} for each distinct data config of the registered
    experiments; the image-folder ones need a tree of image files, and mnist_idx its IDX files,
    which tests/data covers (imagenet_resnet50's: tests/data/test_imagenet_source.py walks its
    data flags; mnist_cnn's: tests/data/test_mnist_idx_flags.py)."""
    found: dict[Any, tuple[str, ExperimentConfig]] = {}
    for name in registry.names():
        exp = registry.load_experiment(name)
        if exp.data.source.kind in ("image_folder", "imagenet_folder", "mnist_idx"):
            continue
        tiny = _tiny_data(exp)
        found.setdefault(tiny.data, (name, tiny))
    return {name: exp for name, exp in found.values()}


# Choices: a switch of each, and the fields of the variants no experiment chooses ---------------------
def _other_kinds(exp: ExperimentConfig, section: str) -> list[tuple[str, str]]:
    """(choice path, kind) of every variant but the chosen one of every choice in `section`
    (`data.source`, `data.tokenizer`, `decode.strategy`)."""
    return [
        (path, kind)
        for path, options in choice_fields(exp)
        if path.startswith(section + ".")
        for kind in options
        if kind != functools.reduce(getattr, path.split("."), exp).kind
    ]


def _variant(exp: ExperimentConfig, path: str, kind: str) -> type:
    return dict(choice_fields(exp))[path][kind]


def _switch(exp: ExperimentConfig, path: str, kind: str) -> ExperimentConfig:
    """`exp` with `--PATH KIND`: the variant's defaults, the fields the two variants share kept
    (`switch_variant`, as the command line switches); a data config made tiny as every one here
    (a source this walk has files for reads them). ValueError where the variant needs a value of
    its own first (an image shape)."""
    current = functools.reduce(getattr, path.split("."), exp)
    switched = exp.override(path, switch_variant(current, _variant(exp, path, kind)))
    return _tiny_data(switched) if path.startswith("data.") else switched


def _starts(exp: ExperimentConfig, section: str) -> bool:
    """Whether a run of `exp` would start as far as `section` is concerned (its files, the model
    against the data and its batches; all of it for the decode section)."""
    try:
        if section == "data":
            exp.data.validate()
            exp.model.check_data(exp.data)
            return set(_input_keys(exp.model)) <= set(_first_batch(exp))  # a classifier takes no token rows
        exp.validate(num_devices=jax.device_count())
    except ValueError:
        return False
    return True


@functools.cache
def _input_keys(model: Any) -> tuple[str, ...]:
    """The batch keys the model built from config `model` needs (traced, nothing computed)."""
    return type(eqx.filter_eval_shape(model.build, jax.random.key(0))).input_keys


def _switched_walks(
    experiments: dict[str, ExperimentConfig], section: str, once: bool = True
) -> dict[str, tuple[ExperimentConfig, str]]:
    """{label: (experiment, the choice whose fields are walked)} for the variants of the choices
    of `section`, so that each variant's own fields are walked too (as the model and learner walk
    walks every switch's own fields). once: each variant none of `experiments` chooses, switched
    on the first of them that takes it (with its other settings); else every other variant on
    every experiment that takes it. Variants that need files this walk lacks (a prepared corpus,
    images, a tokenizer.json) or a value of their own are refused by the switch test below and
    walked in tests/data."""
    chosen = {
        (path, functools.reduce(getattr, path.split("."), exp).kind)
        for exp in experiments.values()
        for path, _ in choice_fields(exp)
        if path.startswith(section + ".")
    }
    found: dict[tuple[str, ...], tuple[str, ExperimentConfig, str]] = {}
    for name, exp in experiments.items():
        for path, kind in _other_kinds(exp, section):
            key = (path, kind) if once else (name, path, kind)
            if once and (path, kind) in chosen or key in found:
                continue
            try:
                switched = _switch(exp, path, kind)
            except ValueError:
                continue
            if _starts(switched, section) and not _inert(switched, path):
                found[key] = (f"{name}[{path}={kind}]", switched, path)
    return {label: (exp, path) for label, exp, path in found.values()}


def _inert(exp: ExperimentConfig, path: str) -> bool:
    try:
        refuse_inert_flags(exp, ["--" + path])
    except InertFlagError:
        return True
    return False


@functools.cache
def _data_walks() -> dict[str, tuple[ExperimentConfig, str]]:
    """{label: (tiny experiment, the data fields walked on it)}: every field of each distinct
    experiment's data, and the source's (or tokenizer's) own of each variant no experiment chooses."""
    walks = {name: (exp, "data") for name, exp in _data_configs().items()}
    return walks | _switched_walks(_data_configs(), "data")


def _data_cases() -> list:
    return [
        pytest.param(label, path, id=f"{label}-{path}")
        for label, (exp, under) in _data_walks().items()
        for path in _section_paths(exp, "data")
        if path.startswith(under + ".") and path not in NO_EFFECT_HERE.keys() | BY_A_RUN
    ]


@pytest.mark.parametrize("label, path", _data_cases())
def test_every_data_flag_of_every_experiment_takes_effect_or_is_refused(label, path):
    check_takes_effect(_data_walks()[label][0], path)


def test_every_source_the_walk_can_read_is_walked():
    """The sources this walk has files for (its corpus; none: made-up examples, the plays, the
    digits) each have their fields walked, chosen by an experiment or switched to."""
    walked = {exp.data.source.kind for exp, _ in _data_walks().values()}
    assert walked >= {"shakespeare", "jsonl", "text_files", "synthetic", "random", "digits", "digits_images"}


@pytest.mark.parametrize("path", _base_cases())
def test_every_run_flag_takes_effect_or_is_refused(path):
    check_takes_effect(_base(), path)


def _representative_cases() -> list:
    return [
        pytest.param(name, path, id=f"{name}-{path}")
        for name in REPRESENTATIVES
        for section in REPRESENTED
        for path in _section_paths(_experiment(name), section)
        if path not in NO_EFFECT_HERE
    ]


@pytest.mark.parametrize("name, path", _representative_cases())
def test_every_task_mesh_and_decode_flag_of_the_other_families_takes_effect_or_is_refused(name, path):
    check_takes_effect(_experiment(name), path)


@functools.cache
def _decode_walks() -> dict[str, tuple[ExperimentConfig, str]]:
    """{label: (experiment, the choice walked)}: each decode strategy the base or a representative
    does not choose, on it (`--decode.strategy beam` on the plays' language model); each family
    decodes in its own way (a prompt's n-best list, an encoder-decoder's examples)."""
    return _switched_walks({name: _experiment(name) for name in (BASE, *REPRESENTATIVES)}, "decode", once=False)


def _decode_switch_cases() -> list:
    return [
        pytest.param(label, path, id=f"{label}-{path}")
        for label, (exp, under) in _decode_walks().items()
        for path in _section_paths(exp, "decode")
        if path.startswith(under + ".")
    ]


@pytest.mark.parametrize("label, path", _decode_switch_cases())
def test_every_flag_of_the_decode_strategies_of_each_family_takes_effect_or_is_refused(label, path):
    check_takes_effect(_decode_walks()[label][0], path)


@pytest.mark.parametrize("path", sorted(NO_EFFECT_HERE))
def test_what_is_listed_as_without_effect_here_has_none(path):
    exp, section = _base(), path.split(".", 1)[0]
    assert path in _section_paths(exp, section), f"{path} is listed ({NO_EFFECT_HERE[path]}) but is no field"
    new = _values(exp, path)[0]
    assert OBSERVABLES[section](exp.override(path, new)) == _baseline(section, exp), (
        f"{path}={new!r} changes what the {section} section does now: take it out of NO_EFFECT_HERE."
    )


def test_every_section_is_walked():
    """A new section of ExperimentConfig needs an observable here, or its flags go untested."""
    sections = {
        f.name for f in dataclasses.fields(ExperimentConfig) if dataclasses.is_dataclass(getattr(_base(), f.name))
    }
    assert sections - {"model", "learner"} == set(SECTIONS)


def _switch_cases() -> list:
    data = [("data", name, exp) for name, exp in _data_configs().items()]
    decode = [("decode", name, _experiment(name)) for name in (BASE, *REPRESENTATIVES)]
    return [
        pytest.param(section, name, path, kind, id=f"{name}-{path}={kind}")
        for section, name, exp in data + decode
        for path, kind in _other_kinds(exp, section)
    ]


@pytest.mark.parametrize("section, name, path, kind", _switch_cases())
def test_switching_a_data_or_decode_choice_changes_what_it_does_or_is_refused(section, name, path, kind):
    """`--data.tokenizer sentencepiece` on a byte-level experiment, and back; `--data.source
    jsonl` on the plays; `--decode.strategy beam`. A refusal names the choice, or the field the
    chosen variant needs a value of (`--data.source custom` without data.custom_input)."""
    exp = _data_configs()[name] if section == "data" else _experiment(name)
    try:
        switched = _switch(exp, path, kind)
        refuse_inert_flags(switched, ["--" + path])
        if section == "data":
            switched.data.validate()
        else:
            switched.validate(num_devices=jax.device_count())
        observed = OBSERVABLES[section](switched)
    except ValueError as error:
        named = "|".join([path.rsplit(".", 1)[-1], *field_names(_variant(exp, path, kind))])
        assert re.search(rf"\b({named})\b", str(error)), f"{path}={kind}: {error}"
        return
    assert observed != _baseline(section, exp), f"--{path} {kind} was accepted and {name}'s {section} is the same"


@config
class _PlantedDataConfig(DataConfig):
    """A data config with one field nothing reads: what this walk exists to catch."""

    planted_knob: int = 0


def test_the_walk_fails_on_a_planted_field_nothing_reads():
    exp = _data_configs()[BASE]
    planted = exp.replace(
        data=_PlantedDataConfig(**{f.name: getattr(exp.data, f.name) for f in dataclasses.fields(exp.data)})
    )
    with pytest.raises(AssertionError, match="planted_knob 1 .* changed nothing the data section does"):
        check_takes_effect(planted, "data.planted_knob")
    assert "took effect" in check_takes_effect(planted, "data.seq_len")  # a real field of the same config
