"""The data sources, one config class a file (data_source.py says what a source answers).

Importing this package imports every module in this folder, so each source registers by its own
definition: adding a source is adding a file here (a user's source is a `DataSource` subclass in
any module the experiment imports). `--data.source KIND` chooses among them.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
