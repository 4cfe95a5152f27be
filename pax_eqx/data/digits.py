"""The 8x8 handwritten digits scikit-learn ships (1,797 images, 10 classes), as examples.

    {"inputs": float32[64] (pixel intensities 0..16 scaled to 0..1), "labels": int32, "weights": 1.0}

A small real dataset that needs no download, for models that are not language models (the
`digits_mlp` experiment). The split is fixed: a seeded permutation of the images, whose last
`eval_fraction` is held out for eval; every host and every run sees the same split.
"""

from __future__ import annotations

import grain
import numpy as np

from pax_eqx.data.file_readers import array_examples
from pax_eqx.extras import check

NUM_FEATURES = 64
NUM_CLASSES = 10
_SPLIT_SEED = 0


EXTRA = "images"
"""The pyproject extra that brings scikit-learn."""


def check_available() -> None:
    """MissingExtraError (the pip install of the `images` extra) when scikit-learn is absent.
    Found, not imported: importing it takes seconds, and a run that only validates (a dry run, a
    refused flag) never reads the digits."""
    check("sklearn", EXTRA, "data.source='digits' (scikit-learn's bundled digits)")


NUM_EXAMPLES = 1797
"""scikit-learn's digits: 1,797 images, fixed."""


def split_size(split: str, eval_fraction: float) -> int:
    """How many of the digits `split` holds (as `digits_examples` splits them), without loading them."""
    num_eval = max(1, round(NUM_EXAMPLES * eval_fraction))
    return num_eval if split == "eval" else NUM_EXAMPLES - num_eval


def digits_examples(split: str, eval_fraction: float) -> grain.MapDataset:
    """This split's examples (module docstring)."""
    check_available()
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(digits.target))
    num_eval = max(1, round(len(order) * eval_fraction))
    chosen = order[-num_eval:] if split == "eval" else order[:-num_eval]
    return array_examples(
        {
            "inputs": (digits.data[chosen] / 16.0).astype(np.float32),
            "labels": digits.target[chosen].astype(np.int32),
            "weights": np.ones(len(chosen), np.float32),
        }
    )
