"""`inspect_data --image-grid`: a PNG grid of the first batch's images, and an error for non-images."""

import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import DataConfig, DigitsImagesSource, DigitsSource, InputConfig
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.inspect_data import inspect, main, write_image_grid


def digits_images_experiment() -> ExperimentConfig:
    return ExperimentConfig(data=DataConfig(source=DigitsImagesSource(), train=InputConfig(batch_size=6)))


def test_command_line_writes_the_grid(tmp_path, capsys):
    grid = tmp_path / "grid.png"
    exp = f"{__name__}.digits_images_experiment"
    assert (
        main(["--exp", exp, "--num-batches", "1", "--image-grid", str(grid), "--data.augment.crop-padding", "1"]) == 0
    )
    out = capsys.readouterr().out
    assert f"image grid: 6 images (8, 8, 1) written to {grid}" in out and "inputs       (6, 8, 8, 1)" in out
    from PIL import Image

    with Image.open(grid) as img:
        assert img.format == "PNG" and img.size[0] > 100


def test_grid_of_colour_images_marks_padding(tmp_path):
    batch = {
        "inputs": np.random.default_rng(0).random((3, 4, 4, 3)).astype(np.float32),
        "labels": np.array([1, 2, 0]),
        "weights": np.array([1.0, 1.0, 0.0]),
    }
    assert "3 images (4, 4, 3)" in write_image_grid(batch, tmp_path / "sub" / "g.png")
    assert (tmp_path / "sub" / "g.png").stat().st_size > 0


def test_image_grid_needs_images(tmp_path):
    with pytest.raises(ConfigError, match="--image-grid needs a batch whose `inputs` are float images"):
        inspect(DataConfig(source=DigitsSource()), num_batches=1, image_grid=tmp_path / "g.png")
