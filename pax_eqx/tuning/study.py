"""The study: Optuna's storage, what identifies a study, and the workers that run its trials.

    STUDY_DIR/study.db          Optuna's SQLite storage (or the database --storage names)
    STUDY_DIR/claim.lock        held by a SQLite study's tuner while it claims a trial
    STUDY_DIR/trials/0007/      trial 7's job dir: config.json, checkpoints/, metrics.jsonl,
                                summaries/, trial.log (the trainer process's output)

A study is recognised by its setup (experiment, flags, search space, metric, direction),
recorded in the study's user attrs when it is created: a rerun with another setup is refused
(pass another --study-dir or --study-name), a rerun with the same setup continues it. Until a
trial is scored, the metric may still change (a misspelt --metric, corrected); the direction is
Optuna's, fixed when the study is created.

`--num-trials N` counts the study's trials, whichever worker, process or machine runs them: a
worker claims a new trial only while fewer than N are finished, running or queued, and a trial
numbered after the first N is dropped at once (recorded as failed with `surplus`, left out of
the report). So N processes on N machines run N trials between them, not N each.

A trial whose worker died is failed and enqueued again with the same params and job dir (the
new trial's `resumes_trial` names it; the dead one is then left out of the count and marked
interrupted in the report): at once when the worker ran on this host and its pid is gone, after
the heartbeat's grace period when it ran elsewhere (Optuna's stale-trial check). The trainer of
the new trial resumes from the job dir's checkpoint. So does a trial whose trainer was killed by
a signal the tuner did not send (kill -9, the out-of-memory killer), up to MAX_KILLS times in a
row.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.tuning import check
from pax_eqx.tuning.space import Choice, Scalar, SearchSpace
from pax_eqx.tuning.trial_lines import TrialLines
from pax_eqx.tuning.trial_run import MetricNotFoundError, Outcome, run_trial

STORAGE_FILE = "study.db"
TRIALS_DIR = "trials"
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)
HOST = socket.gethostname()
# A trainer killed by a signal the tuner did not send (the out-of-memory killer, kill -9) is
# resumed from its checkpoint; killed this many times in a row, the trial fails instead: the
# same configuration would be killed again (a batch too large for the host's memory).
MAX_KILLS = 3


class StudyMismatchError(ConfigError):
    """The study in the storage was started with another setup (a user error: exit 2)."""


def storage_url(study_dir: Path, storage: str | None) -> str:
    return storage or f"sqlite:///{(study_dir / STORAGE_FILE).resolve()}"


def open_storage(url: str, heartbeat_seconds: int) -> optuna.storages.RDBStorage:
    """Optuna's relational storage with heartbeats (a dead worker's trial is requeued after four
    missed beats). SQLite waits for a busy database rather than failing at once."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=heartbeat_seconds,
            grace_period=4 * heartbeat_seconds,
            heartbeat_stale_trial_callback=requeue,
        )
    except ImportError:  # a database without its driver (postgresql:// needs psycopg2)
        raise ConfigError(f"--storage {_shown(url)}: {_missing_driver(url)}") from None
    except Exception as e:  # SQLAlchemy: a bad URL, a database that cannot be reached
        if type(e).__name__ == "NoSuchModuleError":  # an unknown scheme
            raise ConfigError(
                f"--storage {_shown(url)} is not a database URL SQLAlchemy knows ({e}); use sqlite:///PATH, "
                "postgresql://USER:PASSWORD@HOST/DB or mysql+pymysql://USER:PASSWORD@HOST/DB."
            ) from None
        if type(e).__module__.startswith(("sqlalchemy", "optuna")):
            raise ConfigError(f"--storage {_shown(url)}: {type(e).__name__}: {' '.join(str(e).split())}") from None
        raise


# A dialect's default driver (SQLAlchemy's) and the pip package that provides each driver.
_DEFAULT_DRIVER = {"postgresql": "psycopg2", "mysql": "mysqldb", "mariadb": "mysqldb", "mssql": "pyodbc"}
_DRIVER_PACKAGE = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "psycopg[binary]",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "mysqldb": "mysqlclient",
    "pymysql": "PyMySQL",
    "pyodbc": "pyodbc",
}


def _missing_driver(url: str) -> str:
    """What to install for `url`'s database driver, named by its pip package."""
    dialect, _, driver = url.split(":", 1)[0].partition("+")
    driver = driver or _DEFAULT_DRIVER.get(dialect, "")
    package = _DRIVER_PACKAGE.get(driver)
    if package is None:
        return f"the {dialect} database's Python driver is not installed; install it (see SQLAlchemy's dialects)."
    return f"its driver, {driver}, is not installed; pip install {package}."


def _shown(url: str) -> str:
    """`url` with its password hidden (error lines end up in logs)."""
    head, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, at, host = rest.rpartition("@")
        user, colon, _ = credentials.partition(":")
        return repr(f"{head}://{user}{':***' if colon else ''}@{host}")
    return repr(url)


def setup_attrs(exp_name: str, args: Sequence[str], space: SearchSpace) -> dict[str, Any]:
    """What identifies a study: a rerun must match it to continue the study."""
    return {
        "exp": exp_name,
        "args": list(args),
        "space": space.describe(),
        "overrides": list(space.overrides),
        "metric": space.metric,
        "direction": space.direction,
    }


def open_study(
    storage: optuna.storages.BaseStorage, name: str, setup: dict[str, Any], sampler: Any, pruner: Any
) -> optuna.Study:
    """The study `name`, created with `setup` or checked against the one it was created with."""
    study = optuna.create_study(
        storage=storage, study_name=name, direction=setup["direction"], sampler=sampler, pruner=pruner,
        load_if_exists=True,
    )  # fmt: skip
    recorded = study.user_attrs
    if not recorded:
        for key, value in setup.items():
            study.set_user_attr(key, value)
        return study
    differ = [k for k, v in setup.items() if recorded.get(k) != v]
    scored = [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    if differ == ["metric"] and not scored:  # a misspelt --metric stopped it before any score: corrected
        study.set_user_attr("metric", setup["metric"])
        return study
    changed = [f"{k}: {recorded.get(k)!r} -> {setup[k]!r}" for k in differ]
    if changed:
        raise StudyMismatchError(
            f"the study {name!r} in this storage was started with another setup ({'; '.join(changed)}); rerun it "
            "as it was to continue it, or pass a new --study-dir (or --study-name) for a new study."
        )
    return study


def requeue(study: optuna.Study, trial: FrozenTrial, kills: int = 0) -> None:
    """Enqueues `trial`'s params again, in its job dir: the new trial resumes its checkpoint.
    kills: how many times in a row the trial's trainer was killed (see MAX_KILLS)."""
    job_dir = trial.user_attrs.get("job_dir", _job_dir(trial.number))
    attrs = {"resumes_trial": trial.number, "job_dir": job_dir} | ({"kills": kills} if kills else {})
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)


def _job_dir(number: int) -> str:
    return f"{TRIALS_DIR}/{number:04d}"


def replaced(trials: Sequence[FrozenTrial]) -> set[int]:
    """Numbers of the trials another trial resumes (interrupted, run again under a new number)."""
    return {t.user_attrs["resumes_trial"] for t in trials if "resumes_trial" in t.user_attrs}


def counted(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials `--num-trials` counts: not surplus, not replaced by a resumed one."""
    gone = replaced(trials)
    return [t for t in trials if t.state in COUNTED and t.number not in gone and not t.user_attrs.get("surplus")]


CLAIM_LOCK = "claim.lock"


def _claim_lock(study: optuna.Study, study_dir: Path) -> contextlib.AbstractContextManager:
    """What makes a claim (requeue the dead workers' trials, then ask for one) one step among the
    tuners of a SQLite study: an OS lock on DIR/claim.lock. SQLite reads a trial's state outside
    the transaction that then writes it, so two tuners starting together could both take the same
    waiting trial, or both fail a dead worker's trial and queue it twice; either way two trainers
    would race for one job dir. A database server's storage locks the row itself (SELECT ... FOR
    UPDATE) and is shared across hosts, where a file lock would not reach: no lock then."""
    storage = getattr(study._storage, "_backend", study._storage)  # optuna wraps RDBStorage in a cache
    if not str(getattr(storage, "url", "")).startswith("sqlite"):
        return contextlib.nullcontext()
    from filelock import FileLock

    return FileLock(study_dir / CLAIM_LOCK, thread_local=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Tuner:
    """Runs the study's trials in `num_workers` threads, each a trainer process at a time.

    exp_arg: the `--exp` a trial's trainer gets (a name, alias, dotted path or config.json);
    base: that experiment with the space's overrides and `trainer_args` applied. lines: where each
    running trial's progress line goes (None: nowhere); `log` prints the tuner's own lines."""

    def __init__(
        self,
        study: optuna.Study,
        exp_arg: str,
        space: SearchSpace,
        base: ExperimentConfig,
        trainer_args: Sequence[str],
        study_dir: Path,
        num_trials: int,
        *,
        heartbeat_seconds: int,
        log: Callable[[str], None] = print,
        lines: TrialLines | None = None,
    ):
        self.study, self.exp_arg, self.space, self.base = study, exp_arg, space, base
        self.trainer_args = list(trainer_args)
        self.study_dir, self.num_trials = study_dir, num_trials
        self.heartbeat_seconds = heartbeat_seconds
        self.log = log
        self.lines = lines
        self.stop = threading.Event()
        self.interrupted = ""  # why `interrupt` stopped the study
        self.fatal: BaseException | None = None
        self._claiming = threading.Lock()
        self._claiming_everywhere = _claim_lock(study, study_dir)

    def run(self, num_workers: int) -> None:
        """Runs trials until the study has `num_trials`, or until `interrupt`: then the running
        trials save their checkpoints and are requeued before it returns. A KeyboardInterrupt
        does the same, then is re-raised.

        The workers are waited for through events of their own, not Thread.join: a
        KeyboardInterrupt raised inside join makes Python 3.11 take a running thread for a
        finished one (CPython gh-90882), and the trials it runs would be left behind."""
        done = [threading.Event() for _ in range(num_workers)]
        for i, event in enumerate(done):
            threading.Thread(target=self._work, args=(event,), name=f"tuner-{i}", daemon=True).start()

        def wait() -> None:
            while not all(e.is_set() for e in done):
                done[[e.is_set() for e in done].index(False)].wait(0.2)

        try:
            wait()
        except KeyboardInterrupt:
            self.interrupt("KeyboardInterrupt")
            wait()
            raise
        if self.fatal is not None:
            raise self.fatal

    def interrupt(self, reason: str) -> None:
        """Stops the study: each running trainer gets SIGTERM, saves and exits; its trial is
        queued to resume. Safe to call from a signal handler."""
        if not self.stop.is_set():
            self.interrupted = reason
            self.stop.set()
            self.log(f"{reason}: the running trials save a checkpoint and are queued to resume ...")

    def _work(self, done: threading.Event) -> None:
        try:
            while not self.stop.is_set():
                claimed = self._claim()
                if claimed is None:
                    return
                self._run(*claimed)
        except BaseException as e:  # noqa: BLE001 -- handed to the main thread, which raises it
            if self.fatal is None:
                self.fatal = e
            self.stop.set()
        finally:
            done.set()

    # ------------------------------------------------------------------------------ claiming

    def _claim(self) -> tuple[optuna.Trial, dict[str, Scalar]] | None:
        with self._claiming, self._claiming_everywhere:
            self._recover_dead_workers()
            trials = self.study.get_trials(deepcopy=False)
            waiting = any(t.state == TrialState.WAITING for t in trials)
            if not waiting and len(counted(trials)) >= self.num_trials:
                return None
            trial = self.study.ask()
            user = trial.user_attrs  # an enqueued trial's: resumes_trial, job_dir
            if "resumes_trial" not in user:
                before = [t for t in counted(self.study.get_trials(deepcopy=False)) if t.number < trial.number]
                if len(before) >= self.num_trials:  # another process claimed the last one first
                    trial.set_user_attr("surplus", True)
                    self.study.tell(trial, state=TrialState.FAIL)
                    return None
            trial.set_user_attr("job_dir", user.get("job_dir", _job_dir(trial.number)))
            trial.set_user_attr("worker", {"host": HOST, "pid": os.getpid()})
            self.study._storage.record_heartbeat(trial._trial_id)
            values = self.space.suggest(trial)
            return trial, values

    def _recover_dead_workers(self) -> None:
        """Requeues the trials of dead workers: this host's at once (their pid is gone), other
        hosts' once their heartbeat is stale."""
        optuna.storages.fail_stale_trials(self.study)
        storage = self.study._storage
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = t.user_attrs.get("worker") or {}
            if worker.get("host") != HOST or worker.get("pid") == os.getpid() or _alive(worker.get("pid", 0)):
                continue
            try:
                if not storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another worker got there first
            self.log(f"trial {t.number}: its worker (pid {worker.get('pid')}) is gone; queued to resume it")
            requeue(self.study, t)

    # ------------------------------------------------------------------------------- running

    def _run(self, trial: optuna.Trial, values: dict[str, Scalar]) -> None:
        job_dir = self.study_dir / trial.user_attrs["job_dir"]
        try:
            exp = check.trial_experiment(self.base, values)
        except ConfigError as e:  # a combination the experiment refuses
            self._finish(trial, values, Outcome("failed", None, 0, str(e)), 0.0)
            return
        command = [
            sys.executable, "-m", "pax_eqx.train", "--exp", self.exp_arg, "--job-log-dir", str(job_dir),
            *self.trainer_args, *check.flags(self.base, values),
        ]  # fmt: skip
        trial.set_user_attr("command", ["python", *command[1:]])
        trial.set_user_attr("config", exp.to_dict())
        self._wait_for_previous_trainer(trial)
        reported: set[int] = set()

        def report(step: int, value: float) -> bool:
            if step not in reported:
                reported.add(step)
                trial.report(value, step)
            return trial.should_prune()

        def started(pid: int) -> None:
            trial.set_user_attr("worker", {"host": HOST, "pid": os.getpid(), "trainer_pid": pid})

        def watch(record: dict) -> None:
            if self.lines is not None:
                self.lines.record(trial.number, record)

        shown = self.lines.running(trial.number, exp.train.num_steps) if self.lines else contextlib.nullcontext()
        start = time.time()
        try:
            with shown:  # its line goes before the line that says how it ended
                outcome = run_trial(
                    command, job_dir, metric=self.space.metric, num_steps=exp.train.num_steps,
                    stops_early=bool(exp.train.early_stopping.metric), report=report, stopping=self.stop.is_set,
                    heartbeat=lambda: self.study._storage.record_heartbeat(trial._trial_id),
                    heartbeat_seconds=self.heartbeat_seconds, started=started, watch=watch,
                )  # fmt: skip
        except MetricNotFoundError as e:
            self._finish(trial, values, Outcome("failed", None, 0, str(e)), time.time() - start)
            raise
        except BaseException:
            with contextlib.suppress(Exception):
                self._finish(trial, values, Outcome("interrupted", None, 0), time.time() - start)
            raise
        self._finish(trial, values, outcome, time.time() - start)

    def _wait_for_previous_trainer(self, trial: optuna.Trial) -> None:
        """A resumed trial's previous trainer, if it ran here, may still be saving its checkpoint
        (it got SIGTERM when its tuner died): the job dir is its until it exits."""
        previous = trial.user_attrs.get("resumes_trial")
        if previous is None:
            return
        before = [t for t in self.study.get_trials(deepcopy=False) if t.number == previous]
        worker = (before[0].user_attrs.get("worker") if before else None) or {}
        pid = worker.get("trainer_pid")
        deadline = time.time() + 300
        while worker.get("host") == HOST and pid and _alive(pid) and time.time() < deadline:
            self.study._storage.record_heartbeat(trial._trial_id)  # waiting is not dead
            time.sleep(0.5)

    def _finish(self, trial: optuna.Trial, values: dict[str, Scalar], outcome: Outcome, seconds: float) -> None:
        trial.set_user_attr("steps", outcome.step)
        trial.set_user_attr("seconds", round(seconds, 1))
        shown = ", ".join(f"{p}={_short(v)}" for p, v in values.items())
        where = trial.user_attrs.get("job_dir", "")
        metric = self.space.metric
        if outcome.state == "complete":
            self.study.tell(trial, outcome.value)
            self.log(f"trial {trial.number} complete: {metric} {outcome.value:.4g} at step {outcome.step} ({shown}) "
                     f"in {seconds:.0f} s; {where}")  # fmt: skip
        elif outcome.state == "pruned":
            self.study.tell(trial, state=TrialState.PRUNED)
            self.log(f"trial {trial.number} pruned: {metric} {outcome.value:.4g} at its step-{outcome.eval_step} eval "
                     f"({shown}); stopped at step {outcome.step}; {where}")  # fmt: skip
        elif outcome.state == "killed" and trial.user_attrs.get("kills", 0) + 1 < MAX_KILLS:
            kills = trial.user_attrs.get("kills", 0) + 1
            trial.set_user_attr("interrupted", True)
            trial.set_user_attr("error", outcome.error)
            self.study.tell(trial, state=TrialState.FAIL)
            requeue(self.study, self.study._storage.get_trial(trial._trial_id), kills=kills)
            self.log(f"trial {trial.number}: its trainer was {outcome.error}; queued to resume from its checkpoint "
                     f"({kills} of {MAX_KILLS - 1} resumes after a kill)")  # fmt: skip
        elif outcome.state == "killed":
            error = (f"{outcome.error}, its trainer killed {MAX_KILLS} times in a row, so not resumed again (out "
                     f"of host memory? see {where}/trial.log)")  # fmt: skip
            trial.set_user_attr("error", error)
            self.study.tell(trial, state=TrialState.FAIL)
            self.log(f"trial {trial.number} failed ({shown}): {error}; the study goes on")
        elif outcome.state == "interrupted":
            trial.set_user_attr("interrupted", True)
            self.study.tell(trial, state=TrialState.FAIL)
            requeue(self.study, self.study._storage.get_trial(trial._trial_id))
            self.log(f"trial {trial.number} interrupted at step {outcome.step}; queued to resume from its checkpoint")
        else:
            trial.set_user_attr("error", outcome.error)
            self.study.tell(trial, state=TrialState.FAIL)
            self.log(f"trial {trial.number} failed ({shown}): {outcome.error}; the study goes on")


def _short(value: Scalar) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def grid(space: SearchSpace) -> list[dict[str, Scalar]]:
    """Every combination of a space of choices, in the order declared (the last path varies
    fastest). The tuner enqueues them: Optuna's GridSampler would pick them in random order and
    does not count enqueued trials (the baseline, a resumed trial) as visited."""
    bad = [p for p, d in space.params.items() if not isinstance(d, Choice)]
    if bad:
        raise ConfigError(
            f"--sampler grid takes choices only; {', '.join(bad)} {'is a range' if len(bad) == 1 else 'are ranges'}: "
            "write them as choice:A,B,... or use --sampler tpe or random."
        )
    paths = list(space.params)
    return [dict(zip(paths, values)) for values in itertools.product(*(space.params[p].values for p in paths))]
