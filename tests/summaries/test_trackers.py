"""Experiment trackers (`--train.trackers wandb mlflow`): a tiny real run, read back from W&B's
offline run files and MLflow's file store, sends the numbers metrics.jsonl holds, the config and
the command; a second start continues the same tracker runs; a missing package is one line; a
tracker that cannot start stops the run. W&B's files go where docs/trackers.md's command puts
them (WANDB_DIR unset: DIR/wandb/), so that command is not trained again by tests/test_docs_commands.py.

The two train processes (the tracked run, the one whose tracker cannot start) share a JAX
compilation cache: the second compiles nothing (its train step is the first's). The missing
package is checked through train.main in this process (it stops before anything is built)."""

import glob
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pax_eqx.config import ConfigError
from pax_eqx.experiment import TrainConfig
from pax_eqx.summaries import trackers as tracking
from pax_eqx.summaries.writer import TIMING_KEYS, SummaryWriteError, SummaryWriter, read_metrics

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "programs"))
from tiny import TINY, mesh_args  # noqa: E402

ONE_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
_CLOCKS = {"time", "elapsed_s"}  # metrics.jsonl's wall times: not metrics, not sent


def _env(tmp: Path, jax_cache: Path | None = None) -> dict[str, str]:
    """W&B offline (its run in DIR/wandb/, as unset WANDB_DIR leaves it), MLflow's file store allowed
    (MLflow 3 asks for that), nothing remote; with `jax_cache`, compiled programs kept there and
    read back."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env = {**env, **ONE_DEVICE, "WANDB_MODE": "offline", "MLFLOW_ALLOW_FILE_STORE": "true"}
    if jax_cache is not None:
        env.update(
            JAX_COMPILATION_CACHE_DIR=str(jax_cache),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    return env


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> Path:
    """The train processes' compilation cache (the tracked run's train step, read by the next)."""
    return tmp_path_factory.mktemp("jax_cache")


# W&B's offline run file (run-<id>.wandb): LevelDB's log format of protobuf Records, 32 KiB
# blocks of chunks, each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle,
# 4 last), after a 7-byte file header (":W&B", magic 0xBEE1, version).
def _wandb_records(path: str):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", path
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb_runs(job: Path) -> list[dict]:
    """Each offline run directory's run id, project, name, config and history {step: {key: value}},
    from DIR/wandb/ (where docs/trackers.md says `wandb sync` finds them)."""
    runs = []
    for path in sorted(glob.glob(str(job / "wandb" / "offline-run-*" / "run-*.wandb"))):
        run = {"history": {}}
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.update(id=record.run.run_id, project=record.run.project, name=record.run.display_name)
                run["config"] = {i.key: json.loads(i.value_json) for i in record.run.config.update}
            elif kind == "history":
                row = run["history"].setdefault(record.history.step.num, {})
                row.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        runs.append(run)
    return runs


def _logged(job: Path) -> dict[tuple[str, int, str], float]:
    """{(split, step, metric): value} of DIR/metrics.jsonl, its clocks left out."""
    return {
        (r["split"], r["step"], k): v
        for r in read_metrics(job)
        for k, v in r.items()
        if k not in ("step", "split") and k not in _CLOCKS
    }


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, jax_cache):
    """One tiny `python -m pax_eqx.train` run with both trackers."""
    pytest.importorskip("wandb", reason="the [wandb] extra")
    pytest.importorskip("mlflow", reason="the [mlflow] extra")
    tmp = tmp_path_factory.mktemp("tracked")
    job, store = tmp / "job", tmp / "mlruns"
    cmd = [sys.executable, "-m", "pax_eqx.train", "--exp", "shakespeare_char", "--job-log-dir", str(job), *TINY,
           *mesh_args(1), "--train.no-sample-at-end", "--train.trackers", "wandb", "mlflow",
           "--train.tracker-project", "tiny_project", "--train.tracker-run-name", "tiny_run",
           "--train.mlflow-tracking-uri", f"file:{store}"]  # fmt: skip
    done = subprocess.run(cmd, env=_env(tmp, jax_cache), capture_output=True, text=True, timeout=600, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp, job, f"file:{store}"


def _command(job: Path) -> str:
    return [line[2:] for line in (job / "command.txt").read_text().splitlines() if line.startswith("$ ")][-1]


def test_wandb_gets_the_scalars_of_metrics_jsonl_the_config_and_the_command(tracked):
    _, job, _ = tracked
    [run] = _wandb_runs(job)
    run_id = json.loads((job / "trackers.json").read_text())["wandb"]["run_id"]
    assert (run["id"], run["project"], run["name"]) == (run_id, "tiny_project", "tiny_run")
    logged = _logged(job)
    sent = {}
    for step, row in run["history"].items():
        for key, value in row.items():
            if not key.startswith("_"):  # wandb's own: _step, _runtime, _timestamp
                split, name = key.split("/", 1)
                sent[split, step, name] = value
    assert sent == logged  # every number, exactly, and nothing else
    assert {split for split, _, _ in logged} == {"train", "eval"} and ("train", 6, "loss") in logged
    config = json.loads((job / "config.json").read_text())
    assert {k: v for k, v in run["config"].items() if k not in ("_wandb", "command")} == config
    assert run["config"]["command"] == _command(job)
    assert run["config"]["command"].startswith("python -m pax_eqx.train --exp shakespeare_char --job-log-dir ")


def test_mlflow_gets_the_scalars_of_metrics_jsonl_the_config_and_the_command(tracked, monkeypatch):
    from mlflow.tracking import MlflowClient

    _, job, uri = tracked
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("tiny_project").experiment_id])
    assert run.info.run_id == json.loads((job / "trackers.json").read_text())["mlflow"]["run_id"]
    assert (run.info.run_name, run.info.status) == ("tiny_run", "FINISHED")
    sent = {}
    for key in run.data.metrics:
        split, name = key.split("/", 1)
        sent.update({(split, m.step, name): m.value for m in client.get_metric_history(run.info.run_id, key)})
    assert sent == _logged(job)
    config = json.loads((job / "config.json").read_text())
    assert run.data.params["train.num_steps"] == "6" and run.data.params["train.trackers"] == '["wandb", "mlflow"]'
    assert run.data.params["model.num_layers"] == "1" and run.data.params["name"] == "shakespeare_char"
    assert run.data.tags["pax_eqx.command"] == _command(job)
    artifacts = Path(client.download_artifacts(run.info.run_id, "", str(job.parent / "artifacts")))
    assert json.loads((artifacts / "config.json").read_text()) == config
    assert (artifacts / "command.txt").read_text() == _command(job) + "\n"


_RESUME = textwrap.dedent("""
    import sys
    from pax_eqx.summaries.writer import SummaryWriter
    with SummaryWriter(sys.argv[1], start_step=6) as writer:
        writer.write(7, "train", {"loss": 0.5, "total_loss": 0.5})
""")


def test_a_second_start_continues_the_same_tracker_runs(tracked, monkeypatch):
    """What the trainer does when it resumes: a writer on the job dir reopens the runs that
    DIR/trackers.json names (W&B: a second offline file of the same run id; MLflow: the same run)."""
    from mlflow.tracking import MlflowClient

    tmp, job, uri = tracked
    stored = json.loads((job / "trackers.json").read_text())
    done = subprocess.run([sys.executable, "-c", _RESUME, str(job)], env=_env(tmp), capture_output=True, text=True,
                          timeout=300, cwd=tmp)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((job / "trackers.json").read_text()) == stored
    first, second = _wandb_runs(job)
    assert first["id"] == second["id"] == stored["wandb"]["run_id"]
    assert second["history"] == {7: {**second["history"][7], "train/loss": 0.5, "train/total_loss": 0.5}}
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("tiny_project").experiment_id])
    assert run.info.run_id == stored["mlflow"]["run_id"] and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")][-1] == (7, 0.5)


def test_a_missing_tracker_package_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """wandb blocked from importing: exit 1 (the environment), the pip line, no job dir made
    (the train command's main and its error handling, in this process)."""
    from tiny import tiny_args

    from pax_eqx import train
    from pax_eqx.command_line import entry

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, as when it is not installed
    job = tmp_path / "job"
    with pytest.raises(SystemExit) as done:
        entry.run(lambda: train.main(tiny_args(job, "--train.trackers", "wandb")))
    err = capsys.readouterr().err
    assert done.value.code == 1, err
    assert err.strip().splitlines()[-1] == (
        "error: --train.trackers wandb needs wandb, which is not installed: pip install -e '.[wandb]' "
        "(or pip install 'pax_eqx[wandb]')"
    )
    assert "Traceback" not in err and not job.exists()


def test_a_tracker_that_cannot_start_stops_the_run_before_its_first_step(tmp_path, jax_cache):
    """W&B online without a login (no key, no ~/.netrc, no terminal): one error line with the
    library's reason and the fix, exit 1 (the environment), no step taken."""
    pytest.importorskip("wandb", reason="the [wandb] extra")
    job = tmp_path / "job"
    env = {**_env(tmp_path, jax_cache), "HOME": str(tmp_path)}
    del env["WANDB_MODE"]
    cmd = [sys.executable, "-m", "pax_eqx.train", "--exp", "shakespeare_char", "--job-log-dir", str(job), *TINY,
           *mesh_args(1), "--train.trackers", "wandb"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: --train.trackers wandb: wandb.init failed (UsageError: ")
    assert "log in (`wandb login`, or set WANDB_API_KEY), or set WANDB_MODE=offline" in line
    assert not (job / "checkpoints").exists() or not any((job / "checkpoints").iterdir())
    assert (job / "metrics.jsonl").read_text() == ""


# The writer's side, with trackers that record what they are told -----------------------------
class _Recorder:
    def __init__(self, name="recorder", fail_start=False, fail_log=False):
        self.name, self.fail_start, self.fail_log = name, fail_start, fail_log
        self.started, self.logged, self.finished = None, [], []

    def start(self, config, command):
        if self.fail_start:
            raise tracking.TrackerError(f"--train.trackers {self.name}: no server")
        self.started = (config, command)

    def log(self, step, split, scalars):
        if self.fail_log:
            raise ConnectionError("the server went away")
        self.logged.append((step, split, dict(scalars)))

    def finish(self, status):
        self.finished.append(status)


def test_the_writer_sends_each_tracker_the_scalars_and_finishes_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"name": "x", "train": {"trackers": []}}))
    starts = ["# started 1", "$ python -m pax_eqx.train --old", "", "# started 2", "$ python -m pax_eqx.train --new"]
    (tmp_path / "command.txt").write_text("\n".join(starts) + "\n")
    tracker = _Recorder()
    with SummaryWriter(tmp_path, trackers=[tracker]) as writer:
        writer.write(2, "train", {"total_loss": 2.0, "tokens_per_s": 10.0})
        writer.write(3, "eval", {"total_loss": 1.5, "accuracy": float("nan")})
        writer.write_text(3, "decode", "samples", ["ROMEO: hi"])  # text: not a scalar, not sent
    assert tracker.started == ({"name": "x", "train": {"trackers": []}}, "python -m pax_eqx.train --new")
    assert tracker.logged[0] == (2, "train", {"total_loss": 2.0, "tokens_per_s": 10.0, "loss": 2.0})
    assert tracker.logged[1][:2] == (3, "eval") and len(tracker.logged) == 2
    assert tracker.finished == ["finished"]
    # metrics.jsonl's keys less its clocks: the rates are sent, the wall times are not
    assert set(tracker.logged[0][2]) == {k for k in read_metrics(tmp_path)[0] if k not in ("step", "split")} - _CLOCKS
    assert _CLOCKS < TIMING_KEYS


def test_a_tracker_that_cannot_start_stops_the_writer_with_its_reason(tmp_path):
    good, bad = _Recorder("good"), _Recorder("bad", fail_start=True)
    with pytest.raises(SummaryWriteError, match=r"^--train.trackers bad: no server$"):
        SummaryWriter(tmp_path, trackers=[good, bad])
    assert good.finished == ["failed"]  # the one that had started is closed


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path):
    flaky, steady = _Recorder("flaky", fail_log=True), _Recorder("steady")
    with SummaryWriter(tmp_path, trackers=[flaky, steady]) as writer:
        with pytest.warns(tracking.TrackerWarning, match=r"the flaky tracker failed at step 1 \(ConnectionError"):
            writer.write(1, "train", {"total_loss": 1.0})
        writer.write(2, "train", {"total_loss": 0.5})
    assert flaky.finished == ["failed"] and steady.finished == ["finished"]
    assert [step for step, _, _ in steady.logged] == [1, 2]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_writer_never_closed_marks_its_trackers_failed_at_exit(tmp_path):
    """A run that raises never closes its writer: the process's exit finishes the runs as failed."""
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from pax_eqx.summaries.writer import SummaryWriter

        class Tracker:
            name = "file"
            def start(self, config, command): pass
            def log(self, step, split, scalars): pass
            def finish(self, status): Path(sys.argv[1], "status").write_text(status)

        writer = SummaryWriter(sys.argv[1], trackers=[Tracker()])
        writer.write(1, "train", {"total_loss": 1.0})
        raise SystemExit(1)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert (tmp_path / "status").read_text() == "failed"


def test_only_the_trainers_writer_starts_the_trackers_its_config_names(tmp_path, monkeypatch):
    """config.json's train.trackers are started by the metrics.jsonl writer, not by eval's."""
    made = []
    monkeypatch.setattr(tracking, "make_trackers", lambda job, settings: made.append(settings) or [])
    config = {"train": {"trackers": ["wandb"], "tracker_project": "p", "tracker_run_name": ""}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    SummaryWriter(tmp_path).close()
    SummaryWriter(tmp_path, metrics_file="eval_results.jsonl").close()
    assert made == [tracking.TrackerSettings(("wandb",), "p", "", "")]  # the eval writer's asked for none


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"trackers": ("wandb", "wandb")}, r"train.trackers=\('wandb', 'wandb'\) names a tracker twice"),
        ({"tracker_project": "p"}, r"train.tracker_project='p' has no effect without wandb or mlflow in train"),
        ({"trackers": ("wandb",), "mlflow_tracking_uri": "file:/x"},
         r"train.mlflow_tracking_uri='file:/x' has no effect without mlflow .*add --train.trackers mlflow"),
    ],
)  # fmt: skip
def test_tracker_options_without_their_tracker_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**fields)
