"""`--data.source synthetic`: Pax's SyntheticLmData, every row ids = labels = 1 (fixed shapes, no
text): an LM's step without a dataset, for speed and plumbing."""

from __future__ import annotations

from typing import ClassVar

import grain

from pax_eqx.config import config
from pax_eqx.data import lm_examples
from pax_eqx.data.data_source import TokenIdRows, token_rows_input


@config
class SyntheticSource(TokenIdRows):
    """Rows of ones, `num_synthetic_examples` an epoch."""

    kind: ClassVar[str] = "synthetic"

    def inert_data_fields(self, data) -> dict[str, str]:
        """Every row is the same, so no order, seed or host share changes a batch."""
        inert = super().inert_data_fields(data)
        same = f"{self.flag} makes every row the same (ids = labels = 1), so no"
        for split in ("train", "eval"):
            inert[f"{split}.shuffle"] = f"{same} order changes a batch"
            inert[f"{split}.input_random_seed"] = f"{same} seed changes a batch"
            if getattr(data, split).repeat:  # an endless stream of equal rows, whichever share
                inert[f"{split}.num_infeed_hosts"] = f"{same} host's share changes a batch"
                inert[f"{split}.infeed_host_index"] = f"{same} host's share changes a batch"
        if data.train.repeat and data.eval.repeat:
            inert["source.num_synthetic_examples"] = f"{same} count changes a batch when both splits repeat"
        return inert

    def build_input(self, data, split, tokenizer, shard):
        row = lm_examples.synthetic_example(data.seq_len)
        examples = grain.MapDataset.range(self.num_synthetic_examples).map(lambda _: row)
        return token_rows_input(examples, data, split, tokenizer, shard)
