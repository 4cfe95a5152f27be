"""What every `python -m pax_eqx.<program>` shares: user errors become one message and exit 2.

A user error (a bad flag, field, value, path or data file) prints `error: <message>` naming
the field, the value and the fix, and exits with status 2 without a traceback. Set
PAX_EQX_TRACEBACK=1 to see the traceback anyway.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from pax_eqx.cli import CliError
from pax_eqx.config import ConfigError
from pax_eqx.programs.job_dir import JobDirError

USER_ERRORS = (ConfigError, JobDirError, ValueError, FileNotFoundError, NotADirectoryError, PermissionError)


def run(main: Callable[[], int]) -> None:
    try:
        code = main()
    except CliError as e:
        code = e.code
    except USER_ERRORS as e:
        if os.environ.get("PAX_EQX_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        code = 2
    sys.exit(code)
