"""Experiment trackers: the run's scalars, config and command sent to Weights & Biases or MLflow too.

    python -m pax_eqx.train --exp NAME --job-log-dir DIR --train.trackers wandb mlflow \\
        [--train.tracker-project P] [--train.tracker-run-name R] [--train.mlflow-tracking-uri URI]

The job dir stays the record (metrics.jsonl, the TensorBoard events); a tracker gets a copy for
the dashboard a team already uses, as HF Trainer's, Lightning's and Levanter's loggers do. Each
tracker is a class with three methods (`Tracker`): `start(config, command)` opens the tracker's
run with the experiment's JSON (DIR/config.json) and the command that started this run;
`log(step, split, scalars)` sends the numbers metrics.jsonl gets, named `<split>/<metric>`
(`train/loss`, `eval/log_pplx`); `finish(status)` closes it ("finished", or "failed" when the
process exits without closing its writer). The SummaryWriter fans out to them on process 0.

A resumed run continues the same tracker run: its id is kept in DIR/trackers.json, and W&B's
`resume="allow"` or MLflow's run id picks it up (a W&B run drops the steps a killed run logged
past its checkpoint when they are logged again; an MLflow metric keeps both points of such a
step). Where a tracker records is the library's own business, set as its users set it:
WANDB_MODE (offline keeps the run on disk for `wandb sync`), WANDB_API_KEY, WANDB_ENTITY,
WANDB_PROJECT, WANDB_NAME, WANDB_DIR (else DIR/wandb/); MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME
and the server's credentials. The flags win over the variables.

The packages are optional extras (`pip install -e '.[wandb]'`, `'.[mlflow]'`): `require_trackers`
imports them when the train program starts, before anything is written, and names the pip line
when one is missing. A tracker that cannot start its run stops the run there (TrackerError,
with the library's reason); one that fails later is dropped with one warning, and training goes
on: metrics.jsonl still holds every number.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pax_eqx.extras import require

TRACKERS_FILE = "trackers.json"  # in the job dir: each tracker's run id, for a resumed run
_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}  # name -> (module, pyproject extra)


class TrackerError(RuntimeError):
    """A tracker could not start its run (not logged in, a bad tracking URI, no network)."""


class TrackerWarning(UserWarning):
    """A tracker failed mid-run and was dropped; the job dir's records go on."""


@runtime_checkable
class Tracker(Protocol):
    """What the SummaryWriter asks of an experiment tracker."""

    name: str

    def start(self, config: Mapping[str, Any], command: str) -> None:
        """Opens (or, for a resumed run, reopens) the tracker's run with the experiment's JSON and
        the command that started this run; raises TrackerError naming the fix."""

    def log(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        """Sends one logged step's scalars (the numbers of its metrics.jsonl line)."""

    def finish(self, status: str) -> None:
        """Closes the run: status "finished" or "failed"."""


@dataclass(frozen=True)
class TrackerSettings:
    """The train section's tracker fields, as DIR/config.json records them."""

    names: tuple[str, ...] = ()
    project: str = ""
    run_name: str = ""
    mlflow_tracking_uri: str = ""

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> TrackerSettings:
        train = config.get("train") or {}
        return cls(
            tuple(train.get("trackers") or ()),
            train.get("tracker_project") or "",
            train.get("tracker_run_name") or "",
            train.get("mlflow_tracking_uri") or "",
        )


def require_trackers(names: Sequence[str]) -> None:
    """Imports each named tracker's package, or raises MissingExtraError with its pip line: the
    train program calls this at its start, so a missing extra stops it before anything is written."""
    for name in names:
        module, extra = _PACKAGES[name]
        require(module, extra, f"--train.trackers {name}")


def make_trackers(job_dir: str | os.PathLike, settings: TrackerSettings) -> list[Tracker]:
    """One tracker per name in `settings`, not started."""
    makers = {"wandb": WandbTracker, "mlflow": MlflowTracker}
    return [makers[name](Path(job_dir), settings) for name in settings.names]


def run_record(job_dir: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """(the experiment's JSON, the command of this run's start) from DIR/config.json and the last
    `$ ` line of DIR/command.txt; empty when the files are missing or unreadable."""
    job_dir = Path(job_dir)
    try:
        config = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    try:
        lines = (job_dir / "command.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        lines = []
    commands = [line[2:] for line in lines if line.startswith("$ ")]
    return (config if isinstance(config, dict) else {}), (commands[-1] if commands else "")


def _stored(job_dir: Path, name: str) -> dict[str, Any]:
    try:
        state = json.loads((job_dir / TRACKERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entry = state.get(name) if isinstance(state, dict) else None
    return entry if isinstance(entry, dict) else {}


def _store(job_dir: Path, name: str, entry: dict[str, Any]) -> None:
    """Records `name`'s run in DIR/trackers.json (atomically), for the next start to resume."""
    path = job_dir / TRACKERS_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    state = {**(state if isinstance(state, dict) else {}), name: entry}
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:600]}" if text else type(error).__name__


class WandbTracker:
    """A Weights & Biases run: config (the experiment's JSON and `command`), history `<split>/<metric>`
    at the run's step. WANDB_MODE=offline writes it under WANDB_DIR (default DIR/wandb/) for
    `wandb sync`."""

    name = "wandb"

    def __init__(self, job_dir: Path, settings: TrackerSettings):
        self.job_dir, self.settings = job_dir, settings
        self._run: Any = None

    def start(self, config: Mapping[str, Any], command: str) -> None:
        wandb = require("wandb", "wandb", "--train.trackers wandb")
        s = self.settings
        try:
            self._run = wandb.init(
                project=s.project or os.environ.get("WANDB_PROJECT") or config.get("name") or "pax_eqx",
                name=s.run_name or os.environ.get("WANDB_NAME") or self.job_dir.resolve().name,
                id=_stored(self.job_dir, self.name).get("run_id"),  # None: WANDB_RUN_ID, or a new id
                resume="allow",
                config={**config, "command": command},
                dir=None if os.environ.get("WANDB_DIR") else str(self.job_dir),
                job_type="train",
            )
        except Exception as e:  # noqa: BLE001 -- whatever wandb raises, the run cannot go on as asked
            raise TrackerError(
                f"--train.trackers wandb: wandb.init failed ({_reason(e)}); log in (`wandb login`, or set "
                "WANDB_API_KEY), or set WANDB_MODE=offline to keep the run on disk and `wandb sync` it later"
            ) from e
        _store(self.job_dir, self.name, {"run_id": self._run.id})

    def log(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        self._run.log({f"{split}/{name}": value for name, value in scalars.items()}, step=step)

    def finish(self, status: str) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.finish(exit_code=0 if status == "finished" else 1)


_MLFLOW_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow accepts in a metric or param name
_MLFLOW_PARAM_LENGTH = 500  # the shortest limit of MLflow's versions; the full config is an artifact
_MLFLOW_BATCH = 100  # params (and tags) per log_batch; metrics may be 1,000


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"train.num_steps": "1000", ...}: the experiment's JSON as MLflow params."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[_MLFLOW_UNSAFE.sub("_", f"{prefix}{key}")] = text[:_MLFLOW_PARAM_LENGTH]
    return out


class MlflowTracker:
    """An MLflow run in the experiment `tracker_project` (else MLFLOW_EXPERIMENT_NAME, else the
    experiment's name): the config as params (flattened, `train.num_steps`) and as the artifact
    config.json, the command as the tag `pax_eqx.command` and the artifact command.txt, metrics
    `<split>/<metric>` at the run's step. A resumed run keeps its first params (MLflow refuses to
    change one) and adds any new ones; its config.json artifact is replaced by the current one."""

    name = "mlflow"

    def __init__(self, job_dir: Path, settings: TrackerSettings):
        self.job_dir, self.settings = job_dir, settings
        self._client: Any = None
        self._run_id = ""

    def start(self, config: Mapping[str, Any], command: str) -> None:
        require("mlflow", "mlflow", "--train.trackers mlflow")
        from mlflow.tracking import MlflowClient

        s = self.settings
        try:
            self._client = client = MlflowClient(tracking_uri=s.mlflow_tracking_uri or None)
            uri = client.tracking_uri
            stored = _stored(self.job_dir, self.name)
            if stored.get("tracking_uri") == uri and self._reopen(stored.get("run_id")):
                self._run_id = stored["run_id"]
            else:
                experiment = s.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or config.get("name") or "pax_eqx"
                run = client.create_run(
                    self._experiment_id(experiment),
                    run_name=s.run_name or self.job_dir.resolve().name,
                    tags={"pax_eqx.job_dir": str(self.job_dir.resolve())},
                )
                self._run_id = run.info.run_id
            _store(self.job_dir, self.name, {"run_id": self._run_id, "tracking_uri": uri})
            self._log_record(config, command)
        except Exception as e:  # noqa: BLE001 -- whatever MLflow raises, the run cannot go on as asked
            where = s.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "MLflow's default"
            raise TrackerError(
                f"--train.trackers mlflow: the MLflow run could not start at tracking URI {where} ({_reason(e)}); "
                "check the URI (--train.mlflow-tracking-uri or MLFLOW_TRACKING_URI), the server and its credentials"
            ) from e

    def _reopen(self, run_id: str | None) -> bool:
        """Sets the stored run RUNNING again; False when there is none to continue (never
        started, deleted, or not in this tracking store), and a new run is made."""
        if not run_id:
            return False
        try:
            if self._client.get_run(run_id).info.lifecycle_stage != "active":
                return False
        except Exception:  # noqa: BLE001 -- MLflow's "not found" differs by store and version
            return False
        self._client.update_run(run_id, status="RUNNING")
        return True

    def _experiment_id(self, name: str) -> str:
        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self._client.create_experiment(name)
        except Exception:  # another run created it meanwhile
            experiment = self._client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _log_record(self, config: Mapping[str, Any], command: str) -> None:
        """The config (params and config.json) and the command (a tag and command.txt)."""
        from mlflow.entities import Param, RunTag

        client, run_id = self._client, self._run_id
        logged = client.get_run(run_id).data.params
        params = [Param(k, v) for k, v in _flat(config).items() if k not in logged]
        for i in range(0, len(params), _MLFLOW_BATCH):
            client.log_batch(run_id, params=params[i : i + _MLFLOW_BATCH])
        client.log_batch(run_id, tags=[RunTag("pax_eqx.command", command[:5000])])
        client.log_dict(run_id, dict(config), "config.json")
        client.log_text(run_id, command + "\n", "command.txt")

    def log(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_UNSAFE.sub("_", f"{split}/{k}"), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self._client.log_batch(self._run_id, metrics=metrics[i : i + 1000])

    def finish(self, status: str) -> None:
        if self._client is not None and self._run_id:
            run_id, self._run_id = self._run_id, ""
            self._client.set_terminated(run_id, status="FINISHED" if status == "finished" else "FAILED")


def warn_dropped(tracker: Tracker, what: str, error: BaseException) -> None:
    """One warning line for a tracker that failed mid-run (it is dropped; the job dir goes on)."""
    warnings.warn(
        TrackerWarning(
            f"the {tracker.name} tracker failed {what} ({_reason(error)}); it gets nothing more from this run, "
            "which goes on (metrics.jsonl and TensorBoard keep every number)"
        ),
        stacklevel=3,
    )
