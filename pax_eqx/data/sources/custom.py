"""`--data.source custom --data.custom-input pkg.mod.fn`: an Input made by the user's function
`fn(data_cfg, split, tokenizer, shard) -> Input` (Pax's custom BaseInput). A source of one's own
can also be a `DataSource` subclass in one's own module (data_source.py), which then gets its
own `--data.source` name and fields."""

from __future__ import annotations

import importlib
from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data.data_source import DataSource
from pax_eqx.data.input import Input
from pax_eqx.data.tokenizers import check_same_tokenizer


@config
class CustomSource(DataSource):
    """custom_input: `package.module.function`, called as fn(data_cfg, split, tokenizer, shard)
    and returning an Input. It is handed the whole DataConfig, so any field may be read there."""

    kind: ClassVar[str] = "custom"

    custom_input: str = ""

    def check(self, data, files: bool) -> None:
        if files:
            custom_input_factory(self.custom_input)

    def inert_data_fields(self, data) -> dict[str, str]:
        return {}

    def build_input(self, data, split, tokenizer, shard):
        inp = custom_input_factory(self.custom_input)(data, split, tokenizer, shard)
        if not isinstance(inp, Input):
            raise ConfigError(f"data.custom_input={self.custom_input!r} returned {type(inp).__name__}, not an Input.")
        if inp.tokenizer is not None:
            check_same_tokenizer({"experiment": tokenizer, f"data.custom_input ({split})": inp.tokenizer})
        return inp


def custom_input_factory(path: str):
    """The function `data.custom_input` names, imported (a ConfigError naming the path otherwise)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(
            f"data.custom_input={path!r}: give a dotted path package.module.function to a function "
            "(data_cfg, split, tokenizer, shard) -> Input."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"data.custom_input={path!r}: cannot import {module_name!r} ({e}).") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"data.custom_input={path!r}: {module_name!r} has no function {attr!r}.")
    return fn
