"""argparse types for numbers with a range: `--max-shard-gb nan` or `--dry-run-devices 0` is one
`error:` line naming the flag, the value and the range (OneLineParser prints it), not a
traceback deep in the program or a value accepted that cannot work.

    parser.add_argument("--max-shard-gb", type=number(float, gt=0), default=5.0)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number(
    kind: type = float, *, gt: int | float | None = None, ge: int | float | None = None
) -> Callable[[str], float]:
    """An argparse `type=` that parses `kind` (int or float), refuses NaN and infinities, and
    keeps the value above `gt` (strictly) or at least `ge`."""
    bounds = ([] if gt is None else [f"> {gt:g}"]) + ([] if ge is None else [f">= {ge:g}"])
    wanted = ("a whole number" if kind is int else "a finite number") + (" " + " and ".join(bounds) if bounds else "")

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not math.isfinite(value) or (gt is not None and not value > gt) or (ge is not None and not value >= ge):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse
