"""`--data.source array_record --data.path DIR`: a corpus prepared once by
`python -m pax_eqx.prepare_data` into ArrayRecord shards (array_record_source.py says how it is
read). DIR's manifest says the layout, the rows' length and the tokenizer."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, check_range, config
from pax_eqx.data import array_record_source
from pax_eqx.data.data_source import FileSource


@config
class ArrayRecordSource(FileSource):
    """path: the prepared directory, or several comma-separated (a mixture). eval_path: another
    prepared directory ("" = every round(1/eval_fraction)-th record). mixture_weights: a mixture's
    weights, one per directory of path: each training document is drawn from directory i with
    probability weight_i / sum (SeqIO's Mixture; empty = equal)."""

    kind: ClassVar[str] = "array_record"

    mixture_weights: tuple[float, ...] = ()

    def validate(self) -> None:
        super().validate()
        check_range(self, "mixture_weights", gt=0, prefix="data")

    def inert_fields(self) -> dict[str, str]:
        inert = super().inert_fields()
        if len(self.directories()) == 1:
            inert["mixture_weights"] = "data.path names one prepared directory; weights mix several (comma-separated)"
        return inert

    def directories(self) -> list[str]:
        """The prepared directories of path (comma-separated: a mixture)."""
        return [p.strip() for p in self.path.split(",") if p.strip()] or [self.path]

    def check(self, data, files: bool) -> None:
        array_record_source.check_mixture(data)
        if files:
            if not self.path.strip():
                raise ConfigError(
                    "data.path is empty; data.source='array_record' reads a directory prepared by python -m "
                    "pax_eqx.prepare_data (--data.path DIR)."
                )
            array_record_source.check_config(data)

    def configured(self, data):
        """The tokenizer the corpus was tokenized with and, for pre-packed rows, their length."""
        try:
            manifest = array_record_source.PreparedCorpus(self.directories()[0], "data.path").manifest
        except ConfigError:  # no corpus (yet): `check` names the problem where files are read
            return data
        tokenizer = array_record_source.tokenizer_config(manifest, self.directories()[0])
        seq_len = manifest.seq_len if manifest.layout == "rows" else data.seq_len
        return data.replace(tokenizer=tokenizer, seq_len=seq_len)

    def check_tokenizer(self, tokenizer) -> None:
        """Any: the corpus's own (`check` compares it with the manifest)."""

    def draws_from_seed(self, split, data) -> bool:
        return len(self.directories()) > 1 and split == "train"  # each document's directory

    def build_tokenizer(self, data, job_dir):
        return array_record_source.load_tokenizer(data)

    def build_input(self, data, split, tokenizer, shard):
        return array_record_source.prepared_input(data, split, tokenizer, shard)
