"""`python -m pax_eqx.tune --exp NAME --study-dir DIR --num-trials N [--section.field VALUE ...]`

Searches the experiment's hyperparameters: each trial is a `python -m pax_eqx.train` run in its
own job dir under DIR/trials/, with values drawn from the search space the experiment declares
(`register(..., search=SearchSpace(...))`), or the one `--search-space` names, plus any `--param
PATH=DOMAIN`. Eval values are reported as the trial runs, so the pruner stops bad trials early.
The study is kept in DIR/study.db (or the database `--storage` names, shared by every machine
that runs the same command): rerunning the command continues it, interrupted trials resuming
from their checkpoints. At the end: DIR/trials.csv, DIR/best/config.json (run it with
`python -m pax_eqx.train --exp DIR/best/config.json --job-log-dir RUN`) and DIR/plots/*.png.

Flags after the tuner's own are the experiment's, given to every trial (`--train.num-steps 300`).
docs/tuning.md has the details and the multi-machine form.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from pax_eqx.command_line import entry

DESCRIPTION = (
    "Search an experiment's hyperparameters with Optuna: trials are real training runs under --study-dir; rerun the "
    "same command to continue the study; run it on several machines with one --storage URL to share it."
)
# What a study dir holds (besides what --storage keeps elsewhere): a directory holding anything
# else is not one of ours, and a study is not written into it.
_OURS = ("study.db", "claim.lock", "trials", "trials.csv", "best", "plots")


def _parser() -> argparse.ArgumentParser:
    p = entry.OneLineParser(
        prog="python -m pax_eqx.tune",
        usage="python -m pax_eqx.tune --exp NAME --study-dir DIR [--num-trials N] [options] "
        "[--section.field VALUE ...]",
        description=DESCRIPTION,
        epilog="Any other flag is the experiment's (see python -m pax_eqx.train --exp NAME --help) and is passed to "
        "every trial.",
        allow_abbrev=False,
    )
    p.add_argument("--study-dir", required=True, metavar="DIR", help="trials' job dirs, study.db, the report")
    p.add_argument("--num-trials", type=int, default=20, metavar="N", help="trials in the study, all workers together")
    p.add_argument("--num-workers", type=int, default=1, metavar="K", help="trials run at once by this process")
    p.add_argument("--param", action="append", default=[], metavar="PATH=DOMAIN",
                   help="add or replace a searched field: loguniform:LOW:HIGH, uniform:LOW:HIGH[:STEP], "
                   "int:LOW:HIGH[:STEP], logint:LOW:HIGH, choice:A,B,...")  # fmt: skip
    p.add_argument("--search-space", metavar="PKG.MODULE.ATTR",
                   help="a SearchSpace of your own instead of the experiment's")  # fmt: skip
    p.add_argument("--metric", help="the eval metric to optimise (default: the search space's)")
    p.add_argument("--direction", choices=("minimize", "maximize"), help="default: the search space's")
    p.add_argument("--sampler", choices=("tpe", "random", "grid"), default="tpe",
                   help="tpe (default), random, or grid (choices only: every combination once)")  # fmt: skip
    p.add_argument("--pruner", choices=("median", "asha", "none"), default="median",
                   help="median (default): stop a trial whose eval is worse than the median of earlier trials at "
                   "that step; asha: successive halving; none")  # fmt: skip
    p.add_argument("--pruner-startup-trials", type=int, default=3, metavar="N",
                   help="median: trials that complete before any is pruned (default 3)")  # fmt: skip
    p.add_argument("--pruner-warmup-steps", type=int, default=0, metavar="N",
                   help="median: no pruning on evals before step N (long warmups look bad early)")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="the sampler's seed (a study run by one worker repeats)")
    p.add_argument("--storage", metavar="URL",
                   help="a database URL shared by several machines (postgresql://user:pass@host/db); default: "
                   "sqlite in --study-dir")  # fmt: skip
    p.add_argument("--study-name", help="the study's name in the storage (default: the --exp value)")
    p.add_argument("--no-baseline", action="store_true",
                   help="do not run the experiment's own values as the first trial")  # fmt: skip
    p.add_argument("--heartbeat-seconds", type=int, default=30, metavar="S",
                   help="a worker on another machine that misses 4 beats is dead: its trial is resumed")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(argv):
        _parser().print_help()
        return 0
    from pax_eqx.extras import require

    optuna = require("optuna", "tune", "python -m pax_eqx.tune")  # before anything is read or written
    exp_arg = entry.experiment_named(argv)
    print(f"Loading experiment {exp_arg} ...", flush=True)
    from pax_eqx.command_line import cli

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tuner prints one line per trial itself
    # Heartbeats and the stale-trial check are marked experimental, and heartbeats are said to be
    # meant for Study.optimize: the tuner's own loop beats for each trial it runs (study.py).
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    ns, rest = _parser().parse_known_args(argv)
    ranges = (("num_trials", 1, 100_000), ("num_workers", 1, 256), ("pruner_startup_trials", 0, 100_000),
              ("pruner_warmup_steps", 0, 2**31 - 1), ("heartbeat_seconds", 1, 86_400))  # fmt: skip
    for name, low, high in ranges:
        value = getattr(ns, name)
        if not low <= value <= high:
            flag = "--" + name.replace("_", "-")
            raise cli.fail(f"{flag} {value} is out of range: it must be in [{low}, {high}].")
    _refuse_inert_tuner_flags(ns, argv, cli)
    user_args = _without_exp(rest)
    space = _search_space(exp_arg, ns)
    trainer_args = [*space.overrides, *user_args]
    base, job_dir, _ = cli.parse(["--exp", exp_arg, *trainer_args], "python -m pax_eqx.tune", DESCRIPTION,
                                 job_dir_required=False)  # fmt: skip
    if job_dir:
        raise cli.fail(f"--job-log-dir {job_dir}: the tuner gives each trial a job dir under --study-dir; drop it.")
    from pax_eqx.tuning import check

    base.validate(num_devices=None)
    check.check_space(space, base)
    sampler, pruner = _sampler(ns, space), _pruner(ns)
    num_trials, points = ns.num_trials, []
    if ns.sampler == "grid":
        from pax_eqx.tuning.study import grid

        points = grid(space)
        num_trials = min(num_trials, len(points))
    created = not Path(ns.study_dir).exists()
    study_dir = _prepare(Path(ns.study_dir), cli)

    from pax_eqx.tuning.report import write_report
    from pax_eqx.tuning.study import Tuner, open_storage, open_study, setup_attrs, storage_url

    try:
        storage = open_storage(storage_url(study_dir, ns.storage), ns.heartbeat_seconds)
        study = open_study(storage, ns.study_name or exp_arg, setup_attrs(exp_arg, user_args, space), sampler, pruner)
    except BaseException:
        if created and not any(study_dir.iterdir()):
            study_dir.rmdir()  # a refused start leaves no empty study dir behind
        raise
    first = None if ns.no_baseline else check.baseline(space, base)
    queued = ([first] if first is not None else []) + points  # the experiment's own values first, then the grid
    for point in queued:
        study.enqueue_trial(point, skip_if_exists=True)
    searched = ", ".join(f"{p}={d}" for p, d in space.params.items())
    print(
        f"Study {study.study_name!r} in {study_dir}: {num_trials} trials of {exp_arg}, {ns.num_workers} at a "
        f"time, {space.direction} {space.metric} over {searched}",
        flush=True,
    )
    from pax_eqx.tuning.trial_lines import TrialLines

    lines = TrialLines(space.metric)  # each running trial's step, loss and eval, on a line of its own
    tuner = Tuner(study, exp_arg, space, base, trainer_args, study_dir, num_trials,
                  heartbeat_seconds=ns.heartbeat_seconds, log=lines.log, lines=lines)  # fmt: skip

    # SIGINT and SIGTERM stop the study (the trainers save first; a second SIGINT stops at once).
    # Set explicitly: a shell that starts the tuner in the background makes it ignore SIGINT.
    def stop(signum, frame):
        name = signal.Signals(signum).name
        if tuner.stop.is_set() and signum == signal.SIGINT:
            first = tuner.interrupted
            raise KeyboardInterrupt("second SIGINT" if first == "SIGINT" else f"SIGINT after {first}")
        tuner.interrupt(name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        tuner.run(ns.num_workers)
    finally:
        lines.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if tuner.interrupted:
        print(
            f"error: interrupted ({tuner.interrupted}); the study is kept in {study_dir} (the running trials saved "
            "checkpoints and are queued to resume). Rerun the same command to continue it.",
            file=sys.stderr,
        )
        return 130
    print(write_report(study, study_dir))
    trials = study.get_trials(deepcopy=False)
    if not any(t.value is not None for t in trials if t.state.name == "COMPLETE"):
        running = sum(t.state.name == "RUNNING" for t in trials)
        if running:  # another process sharing the study still runs them: not a failure of this one
            print(f"{running} trial(s) of this study still run in another process; rerun to see the full report.")
            return 0
        print(f"error: no trial completed; {study_dir / 'trials.csv'} has each failed trial's error.", file=sys.stderr)
        return 1
    return 0


def _refuse_inert_tuner_flags(ns: argparse.Namespace, argv: list[str], cli) -> None:
    """A tuner flag its sampler or pruner does not read is refused, as an experiment's flag is."""
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    median = "--pruner median"
    inert = {
        "--pruner-startup-trials": (ns.pruner != "median", f"--pruner {ns.pruner} has no startup trials", median),
        "--pruner-warmup-steps": (ns.pruner != "median", f"--pruner {ns.pruner} has no warmup steps", median),
        "--seed": (ns.sampler == "grid", "--sampler grid runs every combination in order and draws nothing",
                   "--sampler tpe or random"),
    }  # fmt: skip
    for flag, (unread, why, reader) in inert.items():
        if unread and flag in given:
            raise cli.fail(f"{flag} would do nothing: {why}. Drop {flag}, or use {reader}.")


def _without_exp(args: list[str]) -> list[str]:
    """`args` without `--exp NAME` / `--exp=NAME` (the tuner passes --exp itself)."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--exp":
            skip = i + 1 < len(args)
        elif not arg.startswith("--exp="):
            out.append(arg)
    return out


def _search_space(exp_arg: str, ns: argparse.Namespace):
    """The experiment's registered space (or --search-space's), with --param, --metric and
    --direction applied."""
    from pax_eqx.command_line import registry
    from pax_eqx.tuning.space import SearchSpace, SearchSpaceError, parse_param

    if ns.search_space:
        space = _load_space(ns.search_space)
    else:
        space = registry.search_space(exp_arg) or SearchSpace({})
    params = dict(space.params)
    for text in ns.param:
        path, domain = parse_param(text)
        params[path] = domain
    changes = {"params": params}
    if ns.metric:
        changes["metric"] = ns.metric
    if ns.direction:
        changes["direction"] = ns.direction
    space = space.replace(**changes)
    if not isinstance(space, SearchSpace):
        raise SearchSpaceError(f"--search-space {ns.search_space!r} is not a SearchSpace.")
    return space


def _load_space(path: str):
    import importlib

    from pax_eqx.tuning.space import SearchSpace, SearchSpaceError

    module_name, _, attr = path.rpartition(".")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise SearchSpaceError(
            f"--search-space {path!r}: cannot load it ({type(e).__name__}: {e}); pass package.module.NAME of a "
            "SearchSpace (run from the directory that holds the package, or add it to PYTHONPATH)."
        ) from None
    value = value() if callable(value) and not isinstance(value, SearchSpace) else value
    if not isinstance(value, SearchSpace):
        raise SearchSpaceError(f"--search-space {path!r} is a {type(value).__name__}, not a SearchSpace.")
    return value


def _sampler(ns: argparse.Namespace, space):
    import optuna

    if ns.sampler in ("random", "grid"):  # grid: every trial is enqueued; the sampler draws none
        return optuna.samplers.RandomSampler(seed=ns.seed)
    # TPE models the trials it has seen; its first ones are random (a third of the study, 2 to 10)
    return optuna.samplers.TPESampler(seed=ns.seed, n_startup_trials=min(10, max(2, ns.num_trials // 3)))


def _pruner(ns: argparse.Namespace):
    import optuna

    if ns.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=ns.pruner_startup_trials, n_warmup_steps=ns.pruner_warmup_steps
        )
    if ns.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def _prepare(study_dir: Path, cli) -> Path:
    """The study dir, created; refused when it is a file or holds what is not a study's."""
    if study_dir.exists() and not study_dir.is_dir():
        raise cli.fail(f"--study-dir {str(study_dir)!r} is a file, not a directory; choose another path.")
    if study_dir.is_dir():
        entries = {p.name for p in study_dir.iterdir()}
        if entries and not entries & set(_OURS):
            raise cli.fail(
                f"--study-dir {str(study_dir)!r} holds files that are not a study's ({', '.join(sorted(entries)[:3])}"
                f"{', ...' if len(entries) > 3 else ''}); choose a new or empty directory."
            )
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        message = f"--study-dir {str(study_dir)!r} cannot be created ({e.strerror}); choose a writable path."
        raise cli.fail(message) from None
    if not os.access(study_dir, os.W_OK | os.X_OK):  # the study's database and the trials' job dirs go there
        raise cli.fail(f"--study-dir {str(study_dir)!r} is not writable; fix its permissions or choose another path.")
    return study_dir


if __name__ == "__main__":
    entry.run(main)
