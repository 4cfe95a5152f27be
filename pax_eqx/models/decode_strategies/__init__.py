"""The decode strategies, one config class a file (decode_strategy.py says what a strategy answers).

Importing this package imports every module in this folder, so each strategy registers by its own
definition: adding a strategy is adding a file here (or a `DecodeStrategy` subclass in any module
an experiment imports). `--decode.strategy KIND` chooses among them.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
