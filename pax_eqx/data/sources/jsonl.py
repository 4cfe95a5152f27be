"""`--data.source jsonl --data.path corpus.jsonl`: JSON-lines files, one document a record (the
field `jsonl_text_key`); the eval split is `eval_path`, or every round(1/eval_fraction)-th record."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import file_readers
from pax_eqx.data.data_source import TextFileDocuments


@config
class JsonlSource(TextFileDocuments):
    """jsonl_text_key: the record field holding the text."""

    kind: ClassVar[str] = "jsonl"
    suffixes: ClassVar[tuple[str, ...]] = file_readers.JSONL_SUFFIXES

    jsonl_text_key: str = "text"

    def validate(self) -> None:
        super().validate()
        if not self.jsonl_text_key:
            raise ConfigError("data.jsonl_text_key is empty; name the record field holding the text (default 'text').")

    def documents(self, split):
        spec, field, held_out_split = self.split_files(split)
        return file_readers.jsonl_documents(spec, field, self.jsonl_text_key, held_out_split, self.eval_fraction)
