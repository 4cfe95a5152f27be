"""Packages that only some commands use live in pyproject's extras; `require` imports one or says
which `pip install` brings it.

The first install (`pip install -e .`) carries what the default run needs. Tuning, seq2seq
metrics, image datasets, data preparation, serving and the experiment trackers each add their own
extra, so a newcomer does not download a gigabyte of tools for a 90-second run. A command that
needs a missing extra stops before it writes anything, with one line naming the extra:

    error: `python -m pax_eqx.tune` needs optuna, which is not installed: pip install -e '.[tune]'
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


class MissingExtraError(ImportError):
    """A package of an optional extra is not installed: the environment, not the input (exit 1)."""


def require(module: str, extra: str, needed_for: str) -> ModuleType:
    """`importlib.import_module(module)`, or a MissingExtraError naming the extra to install.

    module: the import name (`"optuna"`, `"rouge_score.rouge_scorer"`); extra: the pyproject
    extra that brings it (`"tune"`); needed_for: what asked, as the user typed it
    (`"python -m pax_eqx.tune"`, `"--data.eval.metrics rouge"`)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is None or module.split(".")[0] != e.name.split(".")[0]:
            raise  # the package is there and failed inside: a real error, with its traceback
        raise MissingExtraError(_line(module, extra, needed_for)) from None


def check(module: str, extra: str, needed_for: str) -> None:
    """The MissingExtraError `require` raises, found without importing `module`: for a check made
    when the config is validated, long before the package is used (importing scikit-learn or
    sacrebleu takes seconds that a dry run or a refused flag should not pay)."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise MissingExtraError(_line(module, extra, needed_for))


def _line(module: str, extra: str, needed_for: str) -> str:
    package = module.split(".")[0]
    return (
        f"{needed_for} needs {package}, which is not installed: pip install -e '.[{extra}]' "
        f"(or pip install 'pax_eqx[{extra}]')"
    )
