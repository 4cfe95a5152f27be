"""A command line you can trust: kinds are choices of configs, every flag takes effect or is
refused, defaults are never refused, and a job dir written before the choices still resumes.

Each refusal is one `error:` line naming the flag and the reason; nothing is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import registry
from pax_eqx.command_line import cli
from pax_eqx.command_line.cli import FlagError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers import RmsNormConfig
from pax_eqx.learners import LinearSchedule, SgdConfig

OLD_JOB_DIR = Path(__file__).parents[1] / "fixtures" / "job_dir_2026_11_25"


def _parse(name: str, *args: str) -> ExperimentConfig:
    return cli.parse_fields(registry.load_experiment(name), list(args), "test")


# Switches: one flag each, the shared fields kept ---------------------------------------------------
def test_one_flag_switches_the_optimizer_and_keeps_the_learning_rate():
    base = registry.load_experiment("shakespeare_char")
    learner = _parse("shakespeare_char", "--learner.optimizer", "sgd").learner
    assert learner.optimizer == SgdConfig()
    assert (learner.learning_rate, learner.weight_decay, learner.clip_grad_norm, learner.schedule) == (
        base.learner.learning_rate, base.learner.weight_decay, base.learner.clip_grad_norm, base.learner.schedule,
    )  # fmt: skip


def test_a_variant_field_comes_before_or_after_its_switch():
    a = _parse("shakespeare_char", "--learner.optimizer.momentum", "0.5", "--learner.optimizer", "sgd")
    b = _parse("shakespeare_char", "--learner.optimizer", "sgd", "--learner.optimizer.momentum", "0.5")
    assert a.learner.optimizer == b.learner.optimizer == SgdConfig(momentum=0.5)


def test_a_schedule_switch_keeps_the_shared_fields_and_the_old_kind_spelling_still_works():
    """cosine -> linear: both decay, so warmup, peak, decay start and floor carry over."""
    base = registry.load_experiment("shakespeare_char").learner.schedule
    for switch in (["--learner.schedule", "linear"], ["--learner.schedule.kind", "linear"]):
        schedule = _parse("shakespeare_char", *switch, "--learner.schedule.decay-end", "900").learner.schedule
        assert schedule == LinearSchedule(
            warmup_steps=base.warmup_steps, max=base.max, decay_start=base.decay_start, min_ratio=base.min_ratio,
            decay_end=900,
        )  # fmt: skip
    # To rsqrt: only what every schedule has (warmup, peak) carries over.
    rsqrt = _parse("shakespeare_char", "--learner.schedule", "rsqrt").learner.schedule
    assert (rsqrt.kind, rsqrt.warmup_steps, rsqrt.decay_start) == ("rsqrt", base.warmup_steps, 0)


def test_switching_to_constant_needs_no_other_flag():
    """Before the choices, `--learner.schedule.kind constant` was refused over decay_end."""
    assert _parse("shakespeare_char", "--learner.schedule", "constant").learner.schedule.kind == "constant"


def test_a_norm_switch_is_one_flag():
    """Before, `--model.final-norm.kind rms_norm` was refused over a use_bias it never set."""
    exp = _parse("gpt3_xl", "--model.final-norm", "rms_norm")
    assert exp.model.final_norm == RmsNormConfig(epsilon=1e-5)  # the shared epsilon kept


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--learner.optimizer.momentum", "0.5"],
            "'adamw' here, which has no momentum; sgd reads",
        ),
        (["--learner.momentum", "0.5"], "momentum belongs to the learner.optimizer choice now"),
        (["--learner.optimizer", "adamm"], "'adamm' is not one of adamw, adam, sgd, lion, adafactor. Did you mean"),
        (["--data.tokenizer.vocab-size", "100"], "data.tokenizer is 'byte' here, which has no vocab_size"),
    ],
)
def test_a_flag_of_a_variant_not_chosen_is_refused_naming_the_variant(args, message):
    with pytest.raises(FlagError, match=message):
        _parse("shakespeare_char", *args)


# The flags the issue found inert are refused ------------------------------------------------------
@pytest.mark.parametrize(
    "name, args, message",
    [
        # A field of a source that is not the chosen one: the flag as typed, the sources that read it, the switch.
        (
            "shakespeare_char",
            ["--data.path", "x.txt"],
            # the sources that read it listed in the order they were imported, the first of them the switch named
            r"^--data.path: data.source is 'shakespeare' here, which has no path; "
            r"(?=[^;]*\bjsonl\b)(?=[^;]*\btext_files\b)(\w+)(, \w+)* read it. "
            r"Switch with --data.source \1, or drop the flag.$",
        ),
        (
            "shakespeare_char",
            ["--data.source.path", "x.txt"],
            "^--data.source.path: .*'shakespeare' here, which has no path",
        ),
        (
            "shakespeare_char",
            ["--data.eval-path", "x"],
            "^--data.eval-path: .*'shakespeare' here, which has no eval_path",
        ),
        (
            "shakespeare_char",
            ["--data.jsonl-text-key", "body"],
            "^--data.jsonl-text-key: .*no jsonl_text_key; jsonl reads it. Switch with --data.source jsonl",
        ),
        (
            "shakespeare_char",
            ["--data.custom-input", "a.b"],
            "^--data.custom-input: .*no custom_input; custom reads it. Switch with --data.source custom",
        ),
        (
            "shakespeare_char",
            ["--data.num-synthetic-examples", "5"],
            r"^--data.num-synthetic-examples: .*'shakespeare' here, which has no num_synthetic_examples; "
            r"(?=[^;]*\brandom\b)(?=[^;]*\bsynthetic\b)",
        ),
        (
            "shakespeare_char",
            ["--data.source", "array_record", "--data.layout", "packed"],
            "^--data.layout: data.source is 'array_record' here, which has no layout; .*Switch with --data.source",
        ),
        ("shakespeare_char", ["--data.train.eval-loop-num-batches", "3"], "the train input has none"),
        ("shakespeare_char", ["--decode.temperature", "0", "--decode.top-p", "0.9"], "decodes greedily"),
        ("digits_mlp", ["--data.seq-len", "32"], "fixed-size examples, not token rows"),
        (
            "digits_mlp",
            ["--data.layout", "packed"],
            "^--data.layout: data.source is 'digits' here, which has no layout",
        ),
        ("digits_mlp", ["--decode.prompt", "hi"], "decodes examples to records"),
        ("digits_mlp", ["--decode.max-new-tokens", "5"], "decodes examples to records"),
        ("shakespeare_char", ["--decode.inputs", "a.png"], "continues a prompt"),
        ("digits_vit", ["--model.network.block.attention.mask-mode", "praxis"], "no padding or segments"),
        ("digits_vit", ["--model.network.block.ff-paddings"], "no padding or segments"),
    ],
)
def test_an_inert_flag_is_refused_with_its_reason(name, args, message):
    with pytest.raises(FlagError, match=message):
        _parse(name, *args)


def test_an_experiments_own_settings_are_never_refused():
    """Greedy decoding keeps the experiment's top_k: only flags the user gives are checked."""
    assert _parse("shakespeare_char", "--decode.temperature", "0").decode.strategy.temperature == 0.0


def test_a_mesh_rule_must_name_a_logical_axis_of_the_model(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pax_eqx.train", "--job-log-dir", str(tmp_path / "run"), "--mesh.rules",
         "embd=tensor", "--dry-run"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "'embd'" in out.stderr and "Did you mean 'embed'?" in out.stderr
    assert not (tmp_path / "run").exists()


# --help ---------------------------------------------------------------------------------------------
def test_help_is_an_overview_and_help_section_has_every_flag(capsys, monkeypatch):
    """`--help`: the sections with their fields' names and the most used flags, each with its first
    sentence whole; `--help learner`: every learner flag, with its whole help and the chosen
    optimizer's and schedule's fields; `--help-all`: tyro's listing of everything."""
    from pax_eqx import train
    from pax_eqx.command_line.cli import _field_helps

    monkeypatch.setenv("COLUMNS", "100")

    def run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            train.main(list(argv))
        out = capsys.readouterr()
        return info.value.code, out.out, out.err

    code, short, _ = run("--help")
    lines = short.splitlines()
    assert code in (0, None) and len(lines) <= 150, len(lines)
    assert all(len(line) <= 100 and not line.endswith(("...", "…")) for line in lines), short
    assert any(re.match(r"  learner \(LearnerConfig\): optimizer, learning-rate, schedule,", line) for line in lines)
    chosen = r"  --learner.optimizer adamw +the optimizer and its own hyperparameters"
    assert any(re.match(chosen, line) for line in lines)
    flat = " ".join(short.split())
    exp = registry.load_experiment("shakespeare_char")
    for field in ("num_layers", "model_dims", "num_heads"):
        sentence = registry_first_sentence(_field_helps(type(exp.model))[1][field])
        assert f"--model.{field.replace('_', '-')} {getattr(exp.model, field)} {sentence}" in flat  # whole

    code, learner, _ = run("--help", "learner")
    assert code in (0, None)
    flat = " ".join(learner.split())
    helps = _field_helps(type(exp.learner))[1]
    for name in ("learning_rate", "l2_regularization", "clip_update_rms", "frozen"):
        assert f"--learner.{name.replace('_', '-')} " in flat and helps[name] in flat  # every flag, its whole help
    assert "--learner.skip-nonfinite, --learner.no-skip-nonfinite" in flat
    assert "--learner.optimizer.b1 FLOAT" in flat and "--learner.schedule.warmup-steps INT" in flat
    assert all(len(line) <= 100 for line in learner.splitlines())

    code, sgd, _ = run("--learner.optimizer", "sgd", "--help", "learner.optimizer")
    assert code in (0, None) and "--learner.optimizer.momentum FLOAT" in sgd and ".b1 " not in sgd

    code, _, err = run("--help", "lerner")
    assert code == 2 and err.count("\n") == 1  # one line when stderr is no terminal
    assert err.startswith("error: --help lerner: --exp shakespeare_char has no section 'lerner'. Did you mean learner?")
    sections = "model, learner, task, data, train, checkpoint, mesh, decode, profile, lora, quantization"
    assert f"Its sections: {sections};" in err

    code, full, _ = run("--help-all")
    assert code in (0, None) and len(full.splitlines()) > 300


def registry_first_sentence(text: str) -> str:
    from pax_eqx.command_line.registry import first_sentence

    return first_sentence(text)


# A job dir written before the choices ------------------------------------------------------------------
def test_a_job_dir_from_before_the_choices_resumes_and_its_config_round_trips(tmp_path):
    """tests/fixtures/job_dir_2026_11_25: 4 steps of a tiny shakespeare_char by the commit before
    the choices (its command.txt): a flat optimizer and schedule in config.json, no fp8 fields in
    its checkpoint. Resumed with the same experiment (its config.json) to step 6."""
    job = tmp_path / "old"
    shutil.copytree(OLD_JOB_DIR, job)
    saved = json.loads((job / "config.json").read_text())
    assert saved["learner"]["optimizer"] == "adamw"  # the old form
    cfg = ExperimentConfig.from_dict(saved)
    assert cfg.learner.optimizer.kind == "adamw" and cfg.learner.optimizer.b2 == saved["learner"]["b2"]
    assert ExperimentConfig.from_json(cfg.to_json()) == cfg
    out = subprocess.run(
        [sys.executable, "-m", "pax_eqx.train", "--exp", str(job / "config.json"), "--job-log-dir", str(job),
         "--train.num-steps", "6", "--train.no-sample-at-end"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"},  # the run's one device
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in (job / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 6 and (job / "checkpoints" / "6").is_dir()
    assert "steps    4 -> 6" in (job / "train.log").read_text()  # resumed, not restarted
