"""data.source="synthetic_images": random images of data.image_shape, deterministic per index,
through the same host sharding and batching as the other image sources; data.image_shape is
refused where the source has none and checked where images come from files."""

from __future__ import annotations

import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import (
    DataConfig,
    DigitsImagesSource,
    ImageFolderSource,
    ImagesNpzSource,
    InputConfig,
    ShakespeareSource,
    SyntheticImagesSource,
    build_input,
)
from pax_eqx.data.images import synthetic_image_examples
from pax_eqx.data.tokenizers import ByteTokenizer
from pax_eqx.experiment import ExperimentConfig


def data(**source_changes) -> DataConfig:
    """`source_changes`: fields of the synthetic_images source."""
    base = DataConfig(
        source=SyntheticImagesSource(image_shape=(6, 5, 3), num_synthetic_examples=12),
        train=InputConfig(batch_size=3, shuffle=False),
        eval=InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True),
    )
    return base.replace(source=base.source.replace(**source_changes))


def _parse(exp: ExperimentConfig, *args: str) -> ExperimentConfig:
    from pax_eqx.command_line import cli

    return cli.parse_fields(exp, list(args), "test")


def test_images_are_fixed_shape_and_the_same_for_an_index_every_time():
    a, b = synthetic_image_examples(12, (6, 5, 3), "train"), synthetic_image_examples(12, (6, 5, 3), "train")
    ev = synthetic_image_examples(12, (6, 5, 3), "eval")
    assert len(a) == 12 and a[3]["inputs"].shape == (6, 5, 3) and a[3]["inputs"].dtype == np.float32
    np.testing.assert_array_equal(a[3]["inputs"], b[3]["inputs"])
    assert not np.array_equal(a[3]["inputs"], a[4]["inputs"])
    assert not np.array_equal(a[3]["inputs"], ev[3]["inputs"])
    assert 0.0 <= a[3]["inputs"].min() and a[3]["inputs"].max() < 1.0
    assert int(a[3]["labels"]) == 0 and float(a[3]["weights"]) == 1.0


def test_batches_and_host_shards_like_the_other_sources():
    cfg = data()
    cfg.validate()
    batch = build_input(cfg, "train", ByteTokenizer()).get_next()
    assert batch["inputs"].shape == (3, 6, 5, 3) and batch["labels"].shape == (3,)
    hosts = [build_input(cfg, "train", ByteTokenizer(), num_infeed_hosts=2, infeed_host_index=i) for i in (0, 1)]
    seen = [{h.get_next()["inputs"][r].tobytes() for _ in range(2) for r in range(3)} for h in hosts]
    assert len(seen[0]) == len(seen[1]) == 6 and not seen[0] & seen[1]
    ev = build_input(cfg, "eval", ByteTokenizer())
    assert sum(float(b["weights"].sum()) for b in ev) == 12


def test_image_shape_is_required_rejected_or_checked():
    with pytest.raises(ConfigError, match="data.image_shape is empty"):
        data(image_shape=())
    with pytest.raises(ConfigError, match="3 positive sizes"):
        data(image_shape=(6, 5))
    # A source without images has no image_shape, nor synthetic_images a path: no such field, and
    # the flag is refused naming the sources that read it.
    with pytest.raises(ConfigError, match="ShakespeareSource has no field 'image_shape'"):
        ShakespeareSource(image_shape=(6, 5, 3))
    with pytest.raises(
        ConfigError,
        match=r"^--data.image-shape: data.source is 'shakespeare' here, which has no image_shape; images_npz, .*"
        r"synthetic_images.* read it. Switch with --data.source images_npz, or drop the flag.$",
    ):
        _parse(ExperimentConfig(data=DataConfig(source=ShakespeareSource())), "--data.image-shape", "6", "5", "3")
    with pytest.raises(ConfigError, match="SyntheticImagesSource has no field 'path'"):
        SyntheticImagesSource(image_shape=(6, 5, 3), path="x")
    with pytest.raises(
        ConfigError, match=r"^--data.path: data.source is 'synthetic_images' here, which has no path; .*drop the flag.$"
    ):
        _parse(ExperimentConfig(data=data()), "--data.path", "x")
    with pytest.raises(ConfigError, match="digits_images' gives"):
        DataConfig(source=DigitsImagesSource(image_shape=(6, 5, 3))).validate(files=False)
    DataConfig(source=DigitsImagesSource(image_shape=(8, 8, 1))).validate(files=False)


def test_image_shape_checks_the_images_of_a_file_source(tmp_path):
    np.savez(tmp_path / "x.npz", images=np.zeros((10, 4, 4, 1), np.uint8), labels=np.arange(10))
    cfg = DataConfig(source=ImagesNpzSource(path=str(tmp_path / "x.npz"), image_shape=(4, 4, 3)))
    with pytest.raises(ConfigError, match=r"data.image_shape=\(4, 4, 3\) but .* shape \(4, 4, 1\)"):
        build_input(cfg, "train", ByteTokenizer())
    build_input(cfg.replace(source=cfg.source.replace(image_shape=(4, 4, 1))), "train", ByteTokenizer())


def test_a_dry_run_validation_accepts_an_image_source_without_a_path():
    DataConfig(source=ImageFolderSource(image_shape=(6, 5, 3))).validate(files=False)
    with pytest.raises(ConfigError, match="data.path is empty.*synthetic_images"):
        DataConfig(source=ImageFolderSource()).validate()
