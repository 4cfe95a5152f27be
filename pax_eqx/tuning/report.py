"""What a study found: a table of its trials, the best config, and two plots.

    STUDY_DIR/trials.csv                      one row per trial: number, state, each param,
                                              the objective, steps, seconds, job dir, error
    STUDY_DIR/best/config.json                the best trial's resolved experiment, ready to run:
                                              python -m pax_eqx.train --exp STUDY_DIR/best/config.json --job-log-dir DIR
    STUDY_DIR/best/command.txt                the command that ran it
    STUDY_DIR/plots/optimization_history.png  the objective of each trial and the best so far
    STUDY_DIR/plots/param_importances.png     how much each param explains the objective

Everything is read from the study's storage (the config and command of each trial are recorded
there), so any machine of a multi-machine study writes the same report.
"""

from __future__ import annotations

import csv
import json
import shlex
import statistics
import warnings
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from pax_eqx.tuning.study import replaced


def _state(trial: FrozenTrial, gone: set[int]) -> str:
    if trial.number in gone or trial.user_attrs.get("interrupted"):
        return "interrupted"
    return "failed" if trial.state == TrialState.FAIL else trial.state.name.lower()


def rows(study: optuna.Study) -> list[dict[str, object]]:
    """One dict per trial (surplus ones left out), in trial order."""
    trials = study.get_trials(deepcopy=False)
    gone = replaced(trials)
    params = sorted({p for t in trials for p in t.params})
    out = []
    for t in trials:
        if t.user_attrs.get("surplus"):
            continue
        value = t.value if t.state == TrialState.COMPLETE else None
        if t.state == TrialState.PRUNED and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        out.append({
            "trial": t.number,
            "state": _state(t, gone),
            **{p: t.params.get(p, "") for p in params},
            study.user_attrs.get("metric", "value"): "" if value is None else value,
            "steps": t.user_attrs.get("steps", ""),
            "seconds": t.user_attrs.get("seconds", ""),
            "job_dir": t.user_attrs.get("job_dir", ""),
            "resumes": t.user_attrs.get("resumes_trial", ""),
            "error": t.user_attrs.get("error", ""),
        })  # fmt: skip
    return out


def table(table_rows: list[dict[str, object]]) -> str:
    """The rows as aligned text (the error column last, untruncated)."""
    if not table_rows:
        return "(no trials)"
    columns = [c for c in table_rows[0] if any(r[c] != "" for r in table_rows)]
    cells = [[_cell(r[c]) for c in columns] for r in table_rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_report(study: optuna.Study, study_dir: Path) -> str:
    """Writes trials.csv, best/ and plots/ under `study_dir`; returns the text to print."""
    found = rows(study)
    with open(study_dir / "trials.csv", "w", newline="") as f:
        if found:
            writer = csv.DictWriter(f, fieldnames=list(found[0]))
            writer.writeheader()
            writer.writerows(found)
    lines = [table(found), f"trials: {study_dir / 'trials.csv'}"]
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    states = [r["state"] for r in found]
    lines.append(", ".join(f"{states.count(s)} {s}" for s in ("complete", "pruned", "failed", "interrupted", "running",
                                                              "waiting") if s in states))  # fmt: skip
    if complete:
        best = study.best_trial
        metric = study.user_attrs.get("metric", "value")
        median = statistics.median(t.value for t in complete)
        params = ", ".join(f"{k}={_cell(v)}" for k, v in best.params.items())
        lines.append(f"best: trial {best.number}, {metric} {best.value:.4g} (median of the {len(complete)} complete "
                     f"trials: {median:.4g}); params {params}")  # fmt: skip
        lines.append(_write_best(best, study_dir))
    lines += _write_plots(study, study_dir, len(complete))
    return "\n".join(lines)


def _write_best(best: FrozenTrial, study_dir: Path) -> str:
    out = study_dir / "best"
    out.mkdir(exist_ok=True)
    (out / "config.json").write_text(json.dumps(best.user_attrs["config"], indent=2, sort_keys=True))
    (out / "command.txt").write_text(shlex.join(best.user_attrs["command"]) + "\n")
    return (
        f"best config: {out / 'config.json'} (run it: python -m pax_eqx.train --exp {out / 'config.json'} "
        f"--job-log-dir DIR); its trial's job dir: {study_dir / best.user_attrs['job_dir']}"
    )


def _write_plots(study: optuna.Study, study_dir: Path, num_complete: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    out = study_dir / "plots"
    out.mkdir(exist_ok=True)
    drawn, notes = [], []
    charts = [("optimization_history", plots.plot_optimization_history, 1),
              ("param_importances", plots.plot_param_importances, 2)]  # fmt: skip
    for name, draw, needs in charts:
        if num_complete < needs:
            notes.append(f"{name}.png needs {needs} complete trials")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's matplotlib plots are marked experimental
                axes = draw(study)
        except (ValueError, RuntimeError) as e:  # e.g. importances of params that never varied
            notes.append(f"{name}.png: {' '.join(str(e).split())}")
            continue
        axes.figure.tight_layout()
        axes.figure.savefig(out / f"{name}.png", dpi=100)
        plt.close(axes.figure)
        drawn.append(str(out / f"{name}.png"))
    lines = [f"plots: {', '.join(drawn)}"] if drawn else []
    return lines + ([f"not drawn: {'; '.join(notes)}"] if notes else [])
