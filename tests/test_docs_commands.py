"""Every shell command in README.md and docs/*.md, run as a reader runs it.

For each document: the lines of its ```bash blocks (a trailing backslash joins the next line)
run in order, through bash, in one fresh temporary directory (the reader's working directory:
relative job dirs such as `runs/x` land there), after the files the document tells the reader
to create are written there (a fenced block whose first line is `# path/to/file.ext`). Each
command must exit 0 -- or 1 where its comment starts with `exit 1` -- with no traceback and no
`error:` line. A command prefix such as `PYTHONPATH=.` is bash's to honour.

What is not run exactly as written is listed below, each with its reason:

- `SHRINK`: a `python -m pax_eqx.train` that trains (no `--dry-run`, no `--help`) trains for
  minutes; `--train.num-steps 2 --train.no-sample-at-end` is appended (the last value of a
  repeated flag wins, so a `--train.num-steps 500` in the command is overridden; the sample
  printed at the end is `decode`'s, run after it anyway). Nothing else changes: the eval and
  decode commands after it read the job dir it wrote, with their own flags as written.
- `DRY_RUN`: the model does not fit this machine (billions of parameters), or it needs data
  that is not here (C4): `--dry-run` is appended, which parses every flag, builds the model
  abstractly and plans its memory, without devices or data.
- `INSTEAD`: a command replaced by another, and why.
- `NOT_RUN`: the rest, and why.

Every command of a document is in exactly one of: run as written, SHRINK, DRY_RUN, INSTEAD,
NOT_RUN (`test_every_command_is_accounted_for`), so a new command in the docs is run by default.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHRINK = ["--train.num-steps", "2", "--train.no-sample-at-end"]
TIMEOUT_S = 600

DRY_RUN = {
    "python -m pax_eqx.train --exp imagenet_resnet50 --data.path /data/imagenet --data.train.num-workers 16 "
    "--job-log-dir runs/rn50": "ImageNet is not here (tests/data/test_imagenet_source.py reads tiny JPEGs)",
    "python -m pax_eqx.train --exp imagenet_resnet50 --data.source imagenet_array_record --data.path "
    "/data/imagenet_ar --data.train.num-workers 16 --job-log-dir runs/rn50": "ImageNet is not here",
    "python -m pax_eqx.train --exp lm_cloud_spmd_2b_limit_steps --job-log-dir runs/2b": "2.1B parameters: a GPU's job",
    "python -m pax_eqx.train --exp lm_cloud_spmd_2b --job-log-dir runs/2b "
    "--mesh.ici-mesh-shape 1 1 1 --data.train.batch-size 8 --data.eval.batch-size 8": "2.1B parameters on one GPU",
    "python -m pax_eqx.train --exp lm_cloud_transformer_adam --job-log-dir runs/adam "
    "--mesh.ici-mesh-shape 8 1 1 --data.train.batch-size 128 --data.eval.batch-size 128": "eight GPUs",
    "python -m pax_eqx.train --exp c4_spmd_1b_adam_4replicas --job-log-dir runs/c4_1b "
    "--data.path ~/data/c4/en/c4-train.0000*-of-01024.json "
    "--data.eval-path ~/data/c4/en/c4-validation.00000-of-00008.json": "C4 is not on this machine; 1.1B parameters",
    "python -m pax_eqx.train --exp c4_spmd_adam --job-log-dir runs/c4 --data.source array_record "
    "--data.path prepared/c4 --data.eval-path prepared/c4_validation": "C4 is not on this machine; 1.27B parameters",
    "python -m pax_eqx.train --exp imagenet_resnet50 --data.source synthetic_images --job-log-dir runs/rn50":
        "ResNet-50 at batch 512 on 224x224 images: hours of CPU",
}  # fmt: skip

INSTEAD = {
    # command as written -> (what runs instead, why)
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
    "python -m pax_eqx.train --job-log-dir runs/shakespeare": (
        "python -m pax_eqx.train --job-log-dir runs/shakespeare",
        "making a venv and installing need the network; the tests already run in the installed venv",
    ),
    "python -m pax_eqx.tune --exp shakespeare_char --study-dir runs/study --num-trials 12 --train.num-steps 300": (
        "python -m pax_eqx.tune --exp shakespeare_char --study-dir runs/study --num-trials 2 --train.num-steps 20 "
        "--train.eval-interval-steps 10 --train.steps-per-loop 1 --model.num-layers 1 --model.model-dims 32 "
        "--model.hidden-dims 64 --data.seq-len 16 --data.eval.eval-loop-num-batches 1",
        "12 trials of 300 steps are minutes of CPU: 2 trials of a tiny model leave the same files "
        "(tests/tuning/test_tune_cli.py prunes, fails, kills and resumes)",
    ),
    "PYTHONPATH=. python -m pax_eqx.train --exp mypkg.mymodule.my_exp --job-log-dir runs/mine": (
        "PYTHONPATH=. python -m pax_eqx.train --exp mypkg.mymodule.my_exp --job-log-dir runs/mine --data.seq-len 64",
        "LmCloudSpmdTest's 1024-token rows make even 2 steps about a minute of CPU (compiling and running); 64-token "
        "rows train the same module by its dotted path",
    ),
    "WANDB_MODE=offline python -m pax_eqx.train --exp shakespeare_char --job-log-dir runs/tracked --train.trackers "
    "wandb": (
        "python -c \"from pax_eqx.summaries.writer import SummaryWriter; w = SummaryWriter('runs/tracked'); "
        "[w.write(s, 'train', {'total_loss': 4.0 / s}) for s in range(1, 21)]; w.close()\"",
        "tests/summaries/test_trackers.py trains with --train.trackers wandb under WANDB_MODE=offline through this "
        "command line (the tiny model) and reads back the run it writes into DIR/wandb/; a job dir's metrics.jsonl, "
        "written by pax_eqx's SummaryWriter, stands in for runs/tracked so the plots command after it runs as written",
    ),
    "pip install -e .": (
        "SIMULATE_INSTALL",
        "installing would change the venv the tests run in: the README's pyproject.toml is installed as pip "
        "would make it visible, a .dist-info with its entry points on PYTHONPATH",
    ),
}

_PAX_TEMPLATE = (
    "a template (PAX_JOB_DIR is the reader's Paxml job dir, NAME their experiment); "
    "tests/checkpoint/test_pax_import.py runs import_pax, train and eval on the committed Paxml fixtures"
)
_DOCUMENTED_DRY_RUN = (
    "tests/named_experiments/test_experiments_cli_and_docs.py::test_documented_dry_run_commands_work runs every "
    "`python -m pax_eqx.train ... --dry-run` line of these documents and checks the exit status its comment promises"
)
_SPAN_CORRUPTION = (
    "tests/programs/test_cli_seq2seq.py trains shakespeare_span_corruption (shrunk) through train.main, resumes it, "
    "and decodes eval examples with a beam and a prompt with a sentinel through decode.main"
)
_C4_FILES = (
    "needs C4's files; tests/data/test_prepare_data.py runs the same pipeline on the C4-shaped fixture (2 workers, "
    "kill -9, rerun) and tests/data/test_array_record_experiments.py trains c4_spmd_adam on it"
)
_HF = "the model directory is not on this machine; tests/hf/test_import_cli.py runs import, decode and train on a "
_HF += "tiny fixture model, tests/hf/test_export.py the export"
_HF_LORA = "the model directory is not on this machine; tests/hf/test_lora_end_to_end.py imports a tiny fixture, "
_HF_LORA += "trains it with these --lora flags through train.main and exports it merged and --adapters-only"
_SERVE = (
    "a server runs until stopped, and a call needs one running; tests/serving/test_openai_server.py serves a trained "
    "job dir (python -m pax_eqx.serve, SIGTERM) and calls it with curl's requests and the openai client"
)
_EXPORT = (
    "the job dir is the served one, not trained in this document; tests/serving/test_jax_export.py exports a "
    "trained job dir with this CLI (cpu and cuda) and runs the script without pax_eqx importable"
)
NOT_RUN = {
    "pip install -e '.[test]' && python -m pytest -n 2": "the test suite itself (its install would change the venv "
        "the tests run in; tests/test_lean_install.py runs the default run without the extras' packages)",
    "python -m pax_eqx.prepare_images --input /data/imagenet --output /data/imagenet_ar --num-shards 1024 "
    "--val-num-shards 64": "ImageNet is not here; tests/data/test_imagenet_source.py writes shards of tiny JPEGs",
    # docs/fine_tune.md: an open model downloaded beforehand
    "python -m pax_eqx.import_hf ~/models/Llama-3.2-1B --job-log-dir runs/llama": _HF,
    'python -m pax_eqx.decode --job-log-dir runs/llama --prompt "The capital of France is" --max-new-tokens 50': _HF,
    "python -m pax_eqx.train --job-log-dir runs/llama --data.source jsonl --data.path my_data.jsonl --data.seq-len "
    "512 --learner.optimizer adamw --learner.learning-rate 1e-5 --train.num-steps 200": _HF,
    "python -m pax_eqx.eval --job-log-dir runs/llama": _HF,
    "python -m pax_eqx.export_hf --job-log-dir runs/llama --out exported/llama --dtype bfloat16": _HF,
    "python -m pax_eqx.train --exp runs/llama/config.json --job-log-dir runs/llama-lora --lora.base-job-dir runs/llama "
    "--lora.targets 'stack\\.layers\\.attention\\.w_[qv]' --lora.rank 8 --lora.alpha 16 --data.source jsonl "
    "--data.path my_data.jsonl --learner.learning-rate 1e-4 --train.num-steps 200": _HF_LORA,
    "python -m pax_eqx.eval --job-log-dir runs/llama-lora": _HF_LORA,
    "python -m pax_eqx.export_hf --job-log-dir runs/llama-lora --out exported/llama-lora --dtype bfloat16": _HF_LORA,
    "python -m pax_eqx.export_hf --job-log-dir runs/llama-lora --out exported/llama-lora-peft --adapters-only":
        _HF_LORA,
    "python -m benchmarks.lora": "an 81M-parameter model trained both ways: minutes of CPU; its numbers are in "
        "docs/fine_tune.md",
    "python -m pax_eqx.tune --exp shakespeare_char --study-dir runs/study2 --num-trials 8 "
    "--param model.block.activation.name=choice:gelu_exact,relu --param learner.weight-decay=loguniform:1e-3:0.3":
        "8 trials are minutes of CPU; tests/tuning/test_space.py checks --param spaces against the experiment",
    "pip install psycopg2-binary": "would change the venv the tests run in",
    "pip install -e '.[prepare]'": "would change the venv the tests run in; .ci/run installs the extra",
    "python -m pax_eqx.prepare_data --input 'c4/en/c4-train.*.json.gz' --output-dir prepared/c4 --tokenizer "
    "sentencepiece --tokenizer.vocab-size 32128 --num-shards 1024 --num-workers 16": _C4_FILES,
    "python -m pax_eqx.prepare_data --input 'c4/en/c4-validation.*.json.gz' --output-dir prepared/c4_validation "
    "--tokenizer sentencepiece --tokenizer.model-path prepared/c4/tokenizer/spm.model --num-shards 8 "
    "--num-workers 16": _C4_FILES,
    "python -m pax_eqx.prepare_data --input 'gs://my-bucket/c4/en/c4-train.*.json.gz' --output-dir "
    "gs://my-bucket/prepared/c4 --tokenizer sentencepiece --tokenizer.vocab-size 32128 --num-shards 1024 --runner "
    "DataflowRunner --beam-options project=my-project region=us-central1 temp_location=gs://my-bucket/tmp "
    "extra_packages=dist/pax_eqx-0.1.0-py3-none-any.whl": "needs a Google Cloud project and bucket",
    "python -m pax_eqx.prepare_data --input 'hdfs://nn/c4/c4-train.*.json.gz' --output-dir hdfs://nn/prepared/c4 "
    "--tokenizer sentencepiece --tokenizer.vocab-size 32128 --num-shards 1024 --runner FlinkRunner --beam-options "
    "flink_master=flink-host:8081 environment_type=DOCKER environment_config=my-registry/beam-pax-eqx:latest":
        "needs a Flink cluster and HDFS",
    "pip install -e '.[tensorboard]' && tensorboard --logdir runs/x/summaries": "installs into the venv and serves "
        "until stopped; .ci/run installs the extra and tests/summaries/test_summaries_writer.py reads a job dir's "
        "event files with TensorBoard's own reader",
    "python -m pax_eqx.tune --exp shakespeare_char --study-dir runs/study --num-trials 64 --num-workers 2 "
    "--storage postgresql://tuner:secret@db-host/pax_eqx --train.num-steps 2000":
        "needs a PostgreSQL server; tests/tuning/test_tune_cli.py shares one study between two processes",
    "python -m pax_eqx.import_pax --pax-checkpoint PAX_JOB_DIR --exp NAME --job-log-dir OUT [--model.* flags]":
        _PAX_TEMPLATE,
    "python -m pax_eqx.train --exp NAME --job-log-dir OUT [the same flags] --train.num-steps N": _PAX_TEMPLATE,
    "python -m pax_eqx.eval --exp NAME --job-log-dir OUT [the same flags]": _PAX_TEMPLATE,
    "python -m benchmarks.mfu --exp gpt3_xl --steps 20 --warmup 3": "a GPU benchmark (1.3B parameters)",
    "python -m benchmarks.mfu --exp shakespeare_char --steps 5 --warmup 1":
        "minutes of CPU for a smoke run; tests/benchmarks/test_benchmark_commands.py runs benchmarks.mfu shrunk",
    "python -m benchmarks.step_breakdown --exp gpt3_xl": "needs a GPU profile; tests/benchmarks/test_step_breakdown.py",
    "python -m benchmarks.sweep --variants benchmarks/sweeps/gpt3_xl_h100.txt --out runs/sweep.jsonl":
        "runs its variants on an H100; tests/benchmarks/test_sweep.py",
    "python -m benchmarks.images --exp digits_resnet --resnet50 --data.train.batch-size 2":
        "compiles ResNet-50 (minutes of CPU); tests/benchmarks/test_images_benchmark.py",
    # Run by a dedicated test already, in a process of its own or in-process through the same main():
    "python -m pax_eqx.train --help": "tests/programs/test_help.py::test_help_of_the_real_command_is_quick_and_exits_0 "
        "runs this command",
    "python -m pax_eqx.train --exp c4_gpt3_175b --dry-run --mesh.ici-mesh-shape 1 256 4 --data.train.batch-size 1536 "
    "--dry-run-device-memory-gb 80": _DOCUMENTED_DRY_RUN,
    "python -m pax_eqx.train --exp c4_gpt3_175b --dry-run --dry-run-device-memory-gb 80": _DOCUMENTED_DRY_RUN,
    "python -m pax_eqx.train --exp ResNet50Pjit --dry-run": _DOCUMENTED_DRY_RUN,
    "python -m pax_eqx.train --exp C4SpmdPipelineGpt3SmallAdam64Replicas --dry-run": _DOCUMENTED_DRY_RUN,
    "python -m pax_eqx.train --exp shakespeare_span_corruption --job-log-dir runs/s2s": _SPAN_CORRUPTION,
    "python -m pax_eqx.decode --job-log-dir runs/s2s --beam-size 16 --num-samples 16": _SPAN_CORRUPTION,
    'python -m pax_eqx.decode --job-log-dir runs/s2s --beam-size 4 --prompt "ROMEO: <extra_id_0> art thou Romeo?"':
        _SPAN_CORRUPTION,
    "XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m pax_eqx.train --exp shakespeare_pipelined "
    "--job-log-dir runs/pipelined": "tests/programs/test_cli_pipeline.py trains shakespeare_pipelined through "
        "train.main (2 stages, resumed pipelined <-> unpipelined) and checks the registered experiment fits 2 devices",
    "PYTHONPATH=. python -m pax_eqx.train --exp mypkg.mymodule.my_small_gpt --dry-run":
        "tests/named_experiments/test_experiments_cli_and_docs.py::test_doc_user_module_example_runs_by_dotted_path "
        "writes this document's mypkg/mymodule.py and runs this dry run",
    # docs/long_context.md
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.context_parallel_memory":
        "compiles four 2048-token train steps (a minute of CPU); tests/sharding/test_context_parallel.py compiles the "
        "same step at 1 and 8 context shards and checks the ratio of their memory",
    "XLA_FLAGS=--xla_force_host_platform_device_count=32 python -m benchmarks.context_parallel_memory --exp "
    "lm_long_context_32k --shards 8 16 32": "compiles three 32768-token train steps: minutes of CPU",
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pax_eqx.train --exp lm_long_context --job-log-dir "
    "runs/long_context --train.num-steps 3": "tests/sharding/test_context_parallel.py trains it 3 steps through "
        "train.main on its 8 fake devices",
    "python -m pax_eqx.train --exp llama2_7b --data.seq-len 131072 --model.max-seq-len 131072 --data.train.batch-size "
    "8 --mesh.ici-mesh-shape 1 1 1 8 1 --mesh.dcn-mesh-shape 1 1 8 1 1 --model.remat-policy full "
    "--model.block.attention.implementation xla --mesh.device-kind h100 --dry-run --dry-run-device-memory-gb 80":
        _DOCUMENTED_DRY_RUN,
    "python -m pax_eqx.train --exp llama2_7b --data.seq-len 131072 --model.max-seq-len 131072 --data.train.batch-size "
    "8 --dry-run --recommend --dry-run-devices 64": _DOCUMENTED_DRY_RUN,
    "python -m pax_eqx.train --exp llama2_7b --data.seq-len 32768 --model.max-seq-len 32768 --data.train.batch-size 8 "
    "--dry-run --recommend --dry-run-devices 64 --dry-run-device-kind tpu_v5p": _DOCUMENTED_DRY_RUN,
    # docs/serve.md: a server runs until stopped; the calls need it running
    "python -m pax_eqx.serve --job-log-dir runs/shakespeare": _SERVE,
    "curl -s http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' -d '{\"prompt\": \"ROMEO:\", "
    "\"max_tokens\": 40, \"temperature\": 0.8}'": _SERVE,
    "curl -sN http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' -d '{\"prompt\": \"ROMEO:\", "
    "\"max_tokens\": 40, \"stream\": true}'": _SERVE,
    "curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{\"messages\": "
    "[{\"role\": \"user\", \"content\": \"Who is Juliet?\"}], \"max_tokens\": 40}'": _SERVE,
    # docs/serve.md's export: its job dir is the served one, trained elsewhere
    "python -m pax_eqx.export --job-log-dir runs/shakespeare --out exported/shakespeare --platforms cpu cuda": _EXPORT,
    "python exported/shakespeare/run_exported.py exported/shakespeare 86 83 81 73 83 62 --max-tokens 8": _EXPORT,
}  # fmt: skip


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def commands(document: Path) -> list[tuple[str, str]]:
    """(command, comment) for each command line of the ```bash blocks, continuations joined."""
    found = []
    for language, body in blocks(document.read_text()):
        if language != "bash":
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            command, _, comment = line.partition("  #")  # a comment is set off by two spaces
            found.append((" ".join(command.split()), comment.strip().lstrip("#").strip()))
    return found


def files(document: Path) -> dict[str, str]:
    """{path: text} of the blocks whose first line is `# path/to/file.ext`: files the reader makes."""
    made = {}
    for _, body in blocks(document.read_text()):
        first = body.splitlines()[0] if body else ""
        match = re.match(r"^# ([\w./-]+\.\w+)\s*$", first)
        if match:
            made[match.group(1)] = body
    return made


def trains(command: str) -> bool:
    words = shlex.split(command)
    return "pax_eqx.train" in words and not {"--dry-run", "--help", "-h"} & set(words)


def to_run(command: str) -> tuple[str, str]:
    """(the command line that runs, how it differs from the docs' line)."""
    if command in NOT_RUN:
        return "", "not run: " + NOT_RUN[command]
    if command in INSTEAD:
        command, why = INSTEAD[command]
        if command == "SIMULATE_INSTALL":
            return command, why
        how = "instead: " + why
    elif command in DRY_RUN:
        return f"{command} --dry-run", "--dry-run appended: " + DRY_RUN[command]
    else:
        how = "as written"
    if trains(command):
        return f"{command} {shlex.join(SHRINK)}", how + f"; {shlex.join(SHRINK)} appended"
    return command, how


def environment(extra_path: str = "") -> dict[str, str]:
    """A reader's shell: this venv, JAX on the CPU with its one device (not the tests' 8), no
    verbose errors; one persistent compilation cache for all the commands."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PAX_EQX_VERBOSE", "PAX_EQX_TRACEBACK")}
    env.update(
        JAX_PLATFORMS="cpu",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        JAX_COMPILATION_CACHE_DIR=str(Path(os.environ.get("PAX_EQX_DOCS_CACHE", "/tmp")) / "pax_eqx_docs_jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    env.pop("PYTHONPATH", None)
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return env


def simulate_install(cwd: Path) -> str:
    """What `pip install -e .` of the reader's project makes visible to Python: the project's
    modules (they are in `cwd`) and a .dist-info holding the entry points its pyproject.toml
    declares. Returns the directory to put on PYTHONPATH."""
    project = tomllib.loads((cwd / "pyproject.toml").read_text())["project"]
    site = cwd / ".installed"
    dist = site / f"{project['name']}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
        for group, points in project.get("entry-points", {}).items()
    )
    (dist / "entry_points.txt").write_text(entry_points)
    return os.pathsep.join([str(site), str(cwd)])


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_command_is_accounted_for(document):
    """Shell commands live in ```bash blocks (so they are run here); the lists above name only
    commands that exist."""
    for language, body in blocks(document.read_text()):
        if language != "bash":
            assert not re.search(r"^\s*(PYTHONPATH=\S+ )?python3? -m ", body, re.M), (
                f"{document.name}: a shell command in a ```{language or '(unlabelled)'} block; label it ```bash"
            )
    # tyro's booleans are flag pairs (--data.eval.repeat / --data.eval.no-repeat); `--flag False` is refused
    # (`--data.synthetic true` is the one Pax-style boolean the CLI reads itself).
    wrong = re.findall(r"--(?!data\.synthetic\b)[\w.-]+ (?:True|False|true|false)\b", document.read_text())
    assert not wrong, f"{document.name}: boolean flags tyro refuses: {wrong}"
    known = {c for d in DOCUMENTS for c, _ in commands(d)}
    for listed in (*DRY_RUN, *INSTEAD, *NOT_RUN):
        assert listed in known, f"listed but in no document: {listed}"


def documents_with_commands() -> list[Path]:
    return [d for d in DOCUMENTS if any(to_run(c)[0] for c, _ in commands(d))]


@pytest.mark.parametrize("document", documents_with_commands(), ids=lambda p: p.name)
def test_the_commands_of_a_document_run(document, tmp_path, monkeypatch):
    monkeypatch.setenv("PAX_EQX_DOCS_CACHE", str(tmp_path.parent))
    for path, text in files(document).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    extra_path, took = "", []
    for command, comment in commands(document):
        line, how = to_run(command)
        if not line:
            continue
        if line == "SIMULATE_INSTALL":
            extra_path = simulate_install(tmp_path)
            continue
        start = time.perf_counter()
        result = subprocess.run(
            ["bash", "-c", line],
            cwd=tmp_path,
            env=environment(extra_path),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        took.append(f"{time.perf_counter() - start:6.1f}s  {line}")
        expected = 1 if comment.startswith("exit 1") else 0
        context = (
            f"{document.name}: {command}\n({how})\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
        )
        assert result.returncode == expected, context
        assert "Traceback" not in result.stderr, context
        assert not [row for row in result.stderr.splitlines() if row.startswith("error:")], context
    print(f"{document.name}:", *took, sep="\n  ")  # shown with -s: where the time goes
