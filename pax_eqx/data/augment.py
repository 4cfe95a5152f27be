"""Image augmentation and normalisation, as grain transforms (so their randomness is checkpointed).

    data.augment = AugmentConfig(crop_padding=4, horizontal_flip=True, mean=(0.49, 0.48, 0.45), std=(0.25,) * 3)

- **Random crop with padding** (train only): each image [H, W, C] is padded with `crop_padding`
  zero pixels on every side and a random H x W window of the result is kept (CIFAR's recipe).
- **Horizontal flip** (train only; off by default: a flipped digit is not the same digit).
- **Per-channel normalisation** (train and eval, so the model sees one distribution):
  `(x - mean[c]) / std[c]`. It runs before the crop, so the crop's zero padding is the
  dataset mean -- the same value a SAME-padded convolution sees outside the image -- and the
  eval split's weight-0 padding rows stay all zero.

Why per batch, after batching: the train pipeline is `shuffle()[host::hosts].repeat().batch()`
(host_sharding.py), and the only index that grows across epochs is the batch's position in
that repeating stream. `MapDataset.random_map(..., seed=s)` seeds each batch's generator from
(s, batch index), so

- an epoch's crops and flips differ from the previous epoch's (new batch indices);
- a restored iterator (`Input.set_state`) redraws exactly the crops an uninterrupted run
  would have drawn: the iterator state is the batch index, nothing else is random;
- the seed mixes `input_random_seed` with the host index, so hosts do not share crops.

The transform draws B crop offsets then B flip coins, vectorised over the batch with NumPy.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np

from pax_eqx.config import Config, ConfigError, check_range, config


@config
class AugmentConfig(Config):
    """crop_padding: pad P pixels on each side then crop back to H x W (train; 0 = no crop).
    horizontal_flip: flip left-right with probability 1/2 (train; False: digits, text).
    mean / std: per-channel normalisation `(x - mean) / std`, one value per channel, applied
        to train AND eval; both empty = images as decoded (0..1).
    """

    crop_padding: int = 0
    horizontal_flip: bool = False
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "data.augment") -> None:
        check_range(self, "crop_padding", ge=0, prefix=where, note="0 = no random crop")
        if len(self.mean) != len(self.std):
            raise ConfigError(
                f"{where}.mean={self.mean} and {where}.std={self.std} must have one value per channel each; "
                "give both (e.g. --data.augment.mean 0.5 --data.augment.std 0.25) or neither."
            )
        if any(not s > 0 for s in self.std):
            raise ConfigError(f"{where}.std={self.std}: every std must be > 0.")
        check_range(self, "mean", prefix=where)
        check_range(self, "std", gt=0, prefix=where)

    @property
    def normalizes(self) -> bool:
        return bool(self.mean)

    @property
    def randomizes(self) -> bool:
        return self.crop_padding > 0 or self.horizontal_flip

    def check_image_shape(self, shape: tuple[int, ...], source: str, where: str = "data.augment") -> None:
        """ConfigError if mean/std or the crop do not fit images of `shape` [H, W, C]."""
        height, width, channels = shape
        if self.normalizes and len(self.mean) != channels:
            raise ConfigError(
                f"{where}.mean={self.mean} has {len(self.mean)} value(s) but data.source={source!r} gives "
                f"{channels}-channel images {shape}; give one mean and one std per channel."
            )
        if self.crop_padding >= min(height, width):
            raise ConfigError(
                f"{where}.crop_padding={self.crop_padding} is not smaller than the images' {height}x{width}: a crop "
                "could hold no image at all; use a padding below the image size."
            )


class Normalize(grain.transforms.Map):
    """example["inputs"] -> (inputs - mean) / std, per channel (last axis)."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)

    def map(self, element: dict[str, Any]) -> dict[str, Any]:
        return {**element, "inputs": ((element["inputs"] - self.mean) / self.std).astype(np.float32)}


class RandomCropFlip(grain.transforms.RandomMap):
    """A batch's inputs [B, H, W, C]: each row padded by `padding`, cropped at a random offset,
    and flipped left-right with probability 1/2 if `flip`."""

    def __init__(self, padding: int, flip: bool):
        self.padding = padding
        self.flip = flip

    def random_map(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        x = np.asarray(batch["inputs"])
        b, h, w, _ = x.shape
        if self.padding:
            p = self.padding
            padded = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
            dy, dx = rng.integers(0, 2 * p + 1, size=(2, b))
            rows = (dy[:, None] + np.arange(h))[:, :, None]  # [B, H, 1]
            cols = (dx[:, None] + np.arange(w))[:, None, :]  # [B, 1, W]
            x = padded[np.arange(b)[:, None, None], rows, cols]  # [B, H, W, C]
        if self.flip:
            flipped = rng.random(b) < 0.5
            x = np.where(flipped[:, None, None, None], x[:, :, ::-1], x)
        return {**batch, "inputs": np.ascontiguousarray(x, np.float32)}


def normalize_examples(examples: grain.MapDataset, cfg: AugmentConfig) -> grain.MapDataset:
    """Examples with normalised inputs (both splits); unchanged without mean/std."""
    return examples.map(Normalize(cfg.mean, cfg.std)) if cfg.normalizes else examples


def augment_batches(batches: grain.MapDataset, cfg: AugmentConfig, seed: int, host_index: int) -> grain.MapDataset:
    """Training batches with random crops / flips seeded by (seed, host, batch index); unchanged
    when the config asks for neither."""
    if not cfg.randomizes:
        return batches
    host_seed = int(np.random.SeedSequence([seed, host_index]).generate_state(1)[0])
    return batches.random_map(RandomCropFlip(cfg.crop_padding, cfg.horizontal_flip), seed=host_seed)
