"""ImageNet's crops, as Pax's ImageNet input makes them: Inception's random-resized crop with a
random flip for training, the central crop for eval. Pure functions of a decoded image and a
NumPy generator, so a test can recompute every box by hand.

    box = random_resized_box(height, width, size, rng)   # training: area 8-100 %, aspect 3/4-4/3
    box = central_box(height, width, size)                # eval (and the training fallback)
    pixels = crop_resize(image, box, size)                # uint8 [size, size, C]

The conventions (TF's TPU ResNet preprocessing, which Pax's ImageNet input follows):

- **Random-resized crop** (training): up to `MAX_ATTEMPTS` = 10 tries of an area fraction
  uniform in [0.08, 1] of the image and an aspect ratio (width / height) log-uniform in
  [3/4, 4/3]; the box of that area and ratio (rounded to whole pixels) is kept if it fits in
  the image, at an offset uniform over the places it fits. If no try fits (a very long or very
  thin image), the central crop below is used, as TF's `_decode_and_random_crop` falls back
  to `_decode_and_center_crop`. Log-uniform rather than uniform aspect: a portrait and a
  landscape crop are equally likely (torchvision's choice; TF samples the ratio uniformly).
- **Central crop** (eval): a square of side floor(S / (S + 32) * min(H, W)) for an output of
  side S -- TF's CROP_PADDING = 32, so 224/256 = 87.5 % of the shorter side at S = 224 -- at
  offset ((H - side + 1) // 2, (W - side + 1) // 2).
- **Resize**: the crop is resized to S x S with Pillow's bicubic filter, from the cropped
  pixels alone; a crop already S x S is kept as it is. TF's `resize_bicubic` is the same cubic
  but without Pillow's widening of the filter when shrinking (antialiasing): Pillow's choice,
  kept, since a 500-pixel crop shrunk to 224 aliases without it.
- **Flip** (training): left-right with probability 1/2, after the resize.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

MAX_ATTEMPTS = 10
AREA_RANGE = (0.08, 1.0)
ASPECT_RANGE = (3 / 4, 4 / 3)
CROP_PADDING = 32


class Box(NamedTuple):
    """A crop window in pixels: rows top..top+height, columns left..left+width."""

    top: int
    left: int
    height: int
    width: int


def central_box(height: int, width: int, size: int) -> Box:
    """The eval crop of an H x W image for an output of side `size` (module doc)."""
    side = max(1, int(size / (size + CROP_PADDING) * min(height, width)))
    return Box((height - side + 1) // 2, (width - side + 1) // 2, side, side)


def random_resized_box(height: int, width: int, size: int, rng: np.random.Generator) -> Box:
    """Inception's random crop of an H x W image (module doc); the central box after 10 misses."""
    area = height * width
    log_lo, log_hi = math.log(ASPECT_RANGE[0]), math.log(ASPECT_RANGE[1])
    for _ in range(MAX_ATTEMPTS):
        target = area * rng.uniform(*AREA_RANGE)
        ratio = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return Box(top, left, h, w)
    return central_box(height, width, size)


def crop_resize(image, box: Box, size: int) -> np.ndarray:
    """uint8 [size, size, C] (C = 1 for an "L" image, else 3): the PIL `image`'s `box`, bicubic-resized."""
    from PIL import Image

    crop = image.crop((box.left, box.top, box.left + box.width, box.top + box.height))
    if crop.size != (size, size):
        crop = crop.resize((size, size), Image.Resampling.BICUBIC)
    pixels = np.asarray(crop, np.uint8)
    return pixels[..., None] if pixels.ndim == 2 else pixels
