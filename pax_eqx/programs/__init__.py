"""The programs, one room each: `train/`, `evaluate/`, `decode/`, `plan/` (dry run, recommend).
What they share sits here: the compiled steps (`compiled`), what every program builds from an
experiment (`runtime`), and reading a job's state back (`restore`, `lora_base`,
`input_positions`). A room imports only the rooms below it (pyproject's import contracts):
train, then evaluate, then decode | plan, then the shared modules.

The command line (`pax_eqx.command_line`) is the other room of this floor; the entry points
(`pax_eqx.train`, `eval`, `decode`, ...) join the two. The job dir (`pax_eqx.job`) is below both.
"""


def planned_bytes(exp) -> int:
    """The dry-run planner's total per device for `exp` (imported when asked: it loads JAX). What
    the entry points give `command_line.entry.run` for out-of-memory lines."""
    from pax_eqx.programs.plan.dry_run import planned_bytes as plan_total

    return plan_total(exp)
