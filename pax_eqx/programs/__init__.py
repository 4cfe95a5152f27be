"""The programs: compiled steps (`compiled`), the train / eval / decode host loops, the dry-run
planner. The command line (`pax_eqx.command_line`) is the other room of this floor; the entry
points (`pax_eqx.train`, `eval`, `decode`, ...) join the two.
"""


def planned_bytes(exp) -> int:
    """The dry-run planner's total per device for `exp` (imported when asked: it loads JAX). What
    the entry points give `command_line.entry.set_memory_planner` for out-of-memory lines."""
    from pax_eqx.programs.dry_run import planned_bytes as plan_total

    return plan_total(exp)
