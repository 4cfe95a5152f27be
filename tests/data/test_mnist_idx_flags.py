"""Every data flag of `mnist_cnn` takes effect or is refused, on tiny IDX files: the walk of
tests/test_every_run_flag_takes_effect.py, which has no IDX files of its own (as
test_imagenet_source.py walks imagenet_resnet50's data on its tiny JPEG tree). Apart from
test_mnist_idx.py because importing the walk's module costs ~10 s here."""

from __future__ import annotations

import numpy as np
from test_mnist_idx import file_name, write_idx

from experiments import registry


def test_every_data_flag_of_mnist_cnn_takes_effect_or_is_refused(tmp_path):
    from test_every_run_flag_takes_effect import BY_A_RUN, NO_EFFECT_HERE, _section_paths, check_takes_effect

    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 5)):
        write_idx(tmp_path / file_name(f"{prefix}-images-idx3-ubyte"), rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / file_name(f"{prefix}-labels-idx1-ubyte"), rng.integers(0, 10, n))
    exp = registry.load_experiment("mnist_cnn")
    tiny = {"data.source.path": str(tmp_path), "data.train.batch_size": 2, "data.eval.batch_size": 2}
    for path, value in tiny.items():
        exp = exp.override(path, value)
    # data.source: another source given this directory is refused naming data.path, rightly, but not
    # data.source, as the walk asks; each source has its own tests. data.eval.metrics: BY_A_RUN.
    skipped = NO_EFFECT_HERE.keys() | BY_A_RUN | {"data.source"}
    outcomes = {p: check_takes_effect(exp, p) for p in _section_paths(exp, "data") if p not in skipped}
    assert "data.path=" in outcomes["data.source.path"]  # another directory: it has no IDX files
    assert all("took effect" in outcomes[p] for p in ("data.train.shuffle", "data.source.augment.crop_padding"))
    assert "gives (28, 28, 1) images" in outcomes["data.source.image_shape"]
