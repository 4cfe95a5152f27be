"""`--data.source text_files --data.path corpus/*.txt`: local text files, one document a file;
the eval split is `eval_path`, or the last `eval_fraction` of each file."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import config
from pax_eqx.data import file_readers
from pax_eqx.data.data_source import TextFileDocuments


@config
class TextFilesSource(TextFileDocuments):
    """Text files at `path` (a file, directory, glob or comma-separated list)."""

    kind: ClassVar[str] = "text_files"

    def documents(self, split):
        spec, field, held_out_split = self.split_files(split)
        return file_readers.text_file_documents(spec, field, held_out_split, self.eval_fraction)
