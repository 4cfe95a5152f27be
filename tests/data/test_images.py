"""Image sources: digits as 8x8x1 images, .npz files, folders of PNGs and in-memory arrays, each
against its ground truth; host sharding and padded eval epochs; bad inputs name the field."""

import numpy as np
import pytest

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.data import (
    DataConfig,
    DigitsImagesSource,
    DigitsSource,
    ImageFolderSource,
    ImagesNpzSource,
    InputConfig,
    build_input,
    build_tokenizer,
)
from pax_eqx.data.augment import AugmentConfig
from pax_eqx.data.digits import digits_examples
from pax_eqx.data.host_sharding import HostShard
from pax_eqx.data.images import array_image_examples, held_out_indices, image_input

EVAL = InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True)


def read_all(inp):
    return list(inp)


def inputs(data, split, hosts=1, index=0):
    data.validate()
    return build_input(data, split, build_tokenizer(data), hosts, index)


def test_digits_images_are_the_flat_digits_as_8x8x1():
    data = DataConfig(source=DigitsImagesSource(), eval=InputConfig(batch_size=64, **_finite()))
    batches = read_all(inputs(data, "eval"))
    flat = list(digits_examples("eval", data.source.eval_fraction))
    x = np.concatenate([b["inputs"] for b in batches])
    w = np.concatenate([b["weights"] for b in batches])
    y = np.concatenate([b["labels"] for b in batches])
    assert batches[0]["inputs"].shape == (64, 8, 8, 1) and batches[0]["inputs"].dtype == np.float32
    assert batches[0]["labels"].dtype == np.int32 and batches[0]["weights"].dtype == np.float32
    real = w == 1
    assert real.sum() == len(flat) == 180
    np.testing.assert_array_equal(x[real].reshape(len(flat), 64), np.stack([e["inputs"] for e in flat]))
    np.testing.assert_array_equal(y[real], [e["labels"] for e in flat])
    assert not x[~real].any()  # padding rows are all zero

    train = inputs(data, "train").get_next()
    assert train["inputs"].shape == (12, 8, 8, 1) and 0.0 <= train["inputs"].min() and train["inputs"].max() <= 1.0


def _finite():
    return dict(shuffle=False, repeat=False, reset_for_eval=True)


def _parse(experiment: str, *args: str):
    from experiments import registry
    from pax_eqx.command_line import cli

    return cli.parse_fields(registry.load_experiment(experiment), list(args), "test")


def test_digits_images_rejects_fields_that_would_do_nothing():
    # A path of digits_images (which reads no files): no such field, and the flag is refused
    # naming the sources that read it and the fix.
    with pytest.raises(ConfigError, match="DigitsImagesSource has no field 'path'"):
        DigitsImagesSource(path="x")
    with pytest.raises(
        ConfigError,
        match=r"^--data.path: data.source is 'digits_images' here, which has no path; images_npz, image_folder, .* "
        r"read it. Switch with --data.source images_npz, or drop the flag.$",  # an image source first
    ):
        _parse("digits_resnet", "--data.path", "x")
    with pytest.raises(ConfigError, match=r"data.augment.mean=\(0.5, 0.5, 0.5\) has 3 value"):
        DataConfig(source=DigitsImagesSource(augment=AugmentConfig(mean=(0.5,) * 3, std=(0.2,) * 3))).validate()
    # The flat digits are no images: no augment field, and its flag is refused.
    with pytest.raises(ConfigError, match="DigitsSource has no field 'augment'"):
        DigitsSource(augment=AugmentConfig(crop_padding=2))
    with pytest.raises(ConfigError, match="--data.augment.crop-padding"):
        _parse("digits_mlp", "--data.augment.crop-padding", "2")


# --- ground truth for the file sources ----------------------------------------------------------


def write_npz(path, n=10, h=4, w=5, c=None, **drop):
    rng = np.random.default_rng(0)
    shape = (n, h, w) if c is None else (n, h, w, c)
    arrays = {"images": rng.integers(0, 256, shape, dtype=np.uint8), "labels": np.arange(n) % 3}
    for k in drop:
        arrays.pop(k)
    np.savez(path, **arrays)
    return arrays


def write_folder(root, classes=("cat", "dog"), per_class=3, size=(5, 4), mode="L"):
    """root/<class>/<i>.png with a known pixel pattern; returns {file name: (pixels, label)}."""
    from PIL import Image

    truth = {}
    for label, name in enumerate(sorted(classes)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = (size[1], size[0]) if mode == "L" else (size[1], size[0], 3)
            pixels = ((np.arange(np.prod(shape)).reshape(shape) * 7 + 31 * i + 101 * label) % 256).astype(np.uint8)
            Image.fromarray(pixels, mode).save(root / name / f"{i}.png")
            truth[(name, i)] = (pixels, label)
    return truth


def all_real(batches):
    x = np.concatenate([b["inputs"] for b in batches])
    y = np.concatenate([b["labels"] for b in batches])
    w = np.concatenate([b["weights"] for b in batches])
    return x[w == 1], y[w == 1], x[w == 0]


def test_npz_source_with_eval_path(tmp_path):
    train = write_npz(tmp_path / "train.npz", n=10)
    ev = write_npz(tmp_path / "eval.npz", n=5, c=1)
    data = DataConfig(source=ImagesNpzSource(path=str(tmp_path / "train.npz"), eval_path=str(tmp_path / "eval.npz")))
    x, y, pad = all_real(read_all(inputs(data.replace(eval=EVAL), "eval")))
    np.testing.assert_allclose(x, ev["images"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, ev["labels"])
    assert pad.shape == (3, 4, 5, 1) and not pad.any()  # 5 images padded to 2 batches of 4

    one_epoch = data.replace(train=InputConfig(batch_size=10, shuffle=False))
    batch = inputs(one_epoch, "train").get_next()
    np.testing.assert_allclose(batch["inputs"], train["images"][..., None] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(batch["labels"], train["labels"])


def test_npz_held_out_split_is_fixed_and_disjoint(tmp_path):
    arrays = write_npz(tmp_path / "all.npz", n=20, c=3)
    data = DataConfig(source=ImagesNpzSource(path=str(tmp_path / "all.npz"), eval_fraction=0.25), eval=EVAL)
    x_eval, y_eval, _ = all_real(read_all(inputs(data, "eval")))
    expected = held_out_indices(20, "eval", 0.25, "test")
    assert len(expected) == 5 and not set(expected) & set(held_out_indices(20, "train", 0.25, "test"))
    np.testing.assert_allclose(x_eval, arrays["images"][expected] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y_eval, arrays["labels"][expected])


def test_image_folder_source_decodes_every_file_with_its_class(tmp_path):
    truth = write_folder(tmp_path / "train", per_class=3)
    write_folder(tmp_path / "eval", classes=("dog",), per_class=2)  # a subset keeps the train ids
    data = DataConfig(
        source=ImageFolderSource(path=str(tmp_path / "train"), eval_path=str(tmp_path / "eval")),
        train=InputConfig(batch_size=6, shuffle=False),
        eval=EVAL,
    )
    batch = inputs(data, "train").get_next()
    assert batch["inputs"].shape == (6, 4, 5, 1)
    expected = [truth[(c, i)] for c in ("cat", "dog") for i in range(3)]
    np.testing.assert_allclose(batch["inputs"][..., 0], np.stack([p for p, _ in expected]) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(batch["labels"], [0, 0, 0, 1, 1, 1])

    x, y, pad = all_real(read_all(inputs(data, "eval")))
    np.testing.assert_array_equal(y, [1, 1])
    assert len(pad) == 2 and not pad.any()


def test_image_folder_in_colour(tmp_path):
    truth = write_folder(tmp_path, classes=("a",), per_class=2, mode="RGB")
    data = DataConfig(
        source=ImageFolderSource(path=str(tmp_path), eval_path=str(tmp_path)),
        train=InputConfig(batch_size=2, shuffle=False),
    )
    batch = inputs(data, "train").get_next()
    assert batch["inputs"].shape == (2, 4, 5, 3)
    np.testing.assert_allclose(batch["inputs"][1], truth[("a", 1)][0] / 255.0, rtol=1e-6)


def test_in_memory_arrays_through_image_input():
    images = np.arange(6 * 2 * 3, dtype=np.float32).reshape(6, 2, 3)
    examples = array_image_examples(images, np.arange(6))
    inp = image_input(examples, EVAL, AugmentConfig(), "eval", HostShard(count=1, index=0))
    x, y, pad = all_real(read_all(inp))
    np.testing.assert_array_equal(x[..., 0], images)
    np.testing.assert_array_equal(y, np.arange(6))
    assert len(pad) == 2
    with pytest.raises(ConfigError, match="labels must be integers of shape"):
        array_image_examples(images, np.arange(5))


# --- host sharding and padded eval epochs -------------------------------------------------------


def test_two_hosts_are_disjoint_and_cover_the_split(tmp_path):
    write_npz(tmp_path / "d.npz", n=23, h=2, w=2)
    base = DataConfig(source=ImagesNpzSource(path=str(tmp_path / "d.npz"), eval_fraction=0.5), eval=EVAL)
    split_size = len(held_out_indices(23, "eval", 0.5, "test"))
    seen, lengths = [], []
    for host in range(2):
        batches = read_all(inputs(base, "eval", hosts=2, index=host))
        lengths.append(len(batches))
        x, _, pad = all_real(batches)
        assert all(b["weights"].shape == (4,) for b in batches)
        assert len(pad) > 0 and not pad.any()  # every host's epoch ends in weight-0 zero rows
        seen.append({x_i.tobytes() for x_i in x})
    assert lengths[0] == lengths[1]  # every host raises StopIteration after the same batches
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == split_size

    train = base.replace(train=InputConfig(batch_size=2))
    epoch = len(held_out_indices(23, "train", 0.5, "test"))
    firsts = [inputs(train, "train", hosts=2, index=h) for h in range(2)]
    per_host = [np.concatenate([inp.get_next()["inputs"] for _ in range(2)]) for inp in firsts]
    rows = [{r.tobytes() for r in x} for x in per_host]
    assert not rows[0] & rows[1] and len(rows[0] | rows[1]) == 8 <= epoch


# --- augmentation and normalisation ------------------------------------------------------------


def digits_train(**augment):
    return DataConfig(source=DigitsImagesSource(augment=AugmentConfig(**augment)), train=InputConfig(batch_size=32))


def test_augmentation_is_deterministic_per_seed_and_new_every_epoch(tmp_path):
    data = digits_train(crop_padding=2, horizontal_flip=True)
    plain = inputs(digits_train(), "train")
    a, b = inputs(data, "train"), inputs(data, "train")
    batches_a = [a.get_next() for _ in range(3)]
    batches_b = [b.get_next() for _ in range(3)]
    ref = [plain.get_next() for _ in range(3)]
    for x, y, r in zip(batches_a, batches_b, ref):
        np.testing.assert_array_equal(x["inputs"], y["inputs"])
        np.testing.assert_array_equal(x["labels"], r["labels"])  # the same examples, augmented
        assert not np.array_equal(x["inputs"], r["inputs"])
    other = inputs(data.replace(train=InputConfig(batch_size=32, input_random_seed=7)), "train").get_next()
    assert not np.array_equal(other["inputs"], batches_a[0]["inputs"])

    # One image, batch 1: every batch is a new epoch of the same image, cropped anew.
    np.savez(tmp_path / "one.npz", images=np.random.default_rng(1).random((1, 8, 8)), labels=[0])
    one = DataConfig(
        source=ImagesNpzSource(
            path=str(tmp_path / "one.npz"), eval_path=str(tmp_path / "one.npz"), augment=AugmentConfig(crop_padding=3)
        ),
        train=InputConfig(batch_size=1, shuffle=False),
    )
    inp = inputs(one, "train")
    epochs = [inp.get_next()["inputs"] for _ in range(6)]
    assert len({e.tobytes() for e in epochs}) > 1


def test_crop_and_flip_are_windows_of_the_padded_image():
    data = digits_train(crop_padding=2, horizontal_flip=True)
    aug, plain = inputs(data, "train").get_next(), inputs(digits_train(), "train").get_next()
    for x, r in zip(aug["inputs"][..., 0], plain["inputs"][..., 0]):
        padded = np.pad(r, 2)
        windows = [padded[i : i + 8, j : j + 8] for i in range(5) for j in range(5)]
        assert any(np.array_equal(x, win) or np.array_equal(x, win[:, ::-1]) for win in windows)


def test_normalisation_applies_to_eval_and_train():
    mean, std = (0.25,), (0.5,)
    norm = DataConfig(source=DigitsImagesSource(augment=AugmentConfig(mean=mean, std=std)), eval=EVAL)
    plain = DataConfig(source=DigitsImagesSource(), eval=EVAL)
    x, _, pad = all_real(read_all(inputs(norm, "eval")))
    r, _, _ = all_real(read_all(inputs(plain, "eval")))
    np.testing.assert_allclose(x, (r - 0.25) / 0.5, rtol=1e-6)
    assert not pad.any()  # padding rows stay zero (weights 0)
    t = inputs(norm.replace(train=InputConfig(batch_size=8)), "train").get_next()["inputs"]
    p = inputs(plain.replace(train=InputConfig(batch_size=8)), "train").get_next()["inputs"]
    np.testing.assert_allclose(t, (p - 0.25) / 0.5, rtol=1e-6)


def test_iterator_state_restores_augmented_batches():
    data = digits_train(crop_padding=2, horizontal_flip=True, mean=(0.3,), std=(0.4,))
    first = inputs(data, "train")
    for _ in range(3):
        first.get_next()
    state = first.get_state()
    expected = [first.get_next() for _ in range(2)]
    fresh = inputs(data, "train")
    fresh.set_state(state)
    for want in expected:
        got = fresh.get_next()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


# --- bad inputs name the field ------------------------------------------------------------------


def test_missing_folder_and_npz(tmp_path):
    with pytest.raises(MissingFileError, match="data.path=.*is not an existing folder"):
        DataConfig(source=ImageFolderSource(path=str(tmp_path / "nope"))).validate()
    with pytest.raises(MissingFileError, match="data.eval_path=.*does not exist"):
        write_npz(tmp_path / "a.npz")
        DataConfig(source=ImagesNpzSource(path=str(tmp_path / "a.npz"), eval_path=str(tmp_path / "b.npz"))).validate()
    with pytest.raises(ConfigError, match="data.path is empty"):
        DataConfig(source=ImagesNpzSource()).validate()
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(MissingFileError, match="class folder 'cls' has no .png"):
        DataConfig(source=ImageFolderSource(path=str(tmp_path / "empty"))).validate()


def test_npz_without_labels(tmp_path):
    write_npz(tmp_path / "x.npz", labels=True)
    with pytest.raises(ConfigError, match=r"data.path=.*x.npz' has no 'labels' array \(it has \['images'\]\)"):
        DataConfig(source=ImagesNpzSource(path=str(tmp_path / "x.npz"))).validate()


def test_mixed_image_sizes_name_the_first_odd_file(tmp_path):
    write_folder(tmp_path / "a", classes=("x",), per_class=2, size=(5, 4))
    write_folder(tmp_path / "b", classes=("y",), per_class=1, size=(6, 4))
    (tmp_path / "b" / "y").rename(tmp_path / "a" / "y")
    data = DataConfig(source=ImageFolderSource(path=str(tmp_path / "a")), train=InputConfig(batch_size=2))
    with pytest.raises(ConfigError, match=r"data.path=.*y/0.png' is 6x4 \(width x height\) but .*x/0.png' is 5x4"):
        inputs(data, "train")


def test_eval_folder_with_an_unknown_class(tmp_path):
    write_folder(tmp_path / "train", classes=("a",))
    write_folder(tmp_path / "eval", classes=("b",))
    data = DataConfig(source=ImageFolderSource(path=str(tmp_path / "train"), eval_path=str(tmp_path / "eval")))
    with pytest.raises(ConfigError, match=r"data.eval_path=.*has class folder\(s\) \['b'\] that data.path lacks"):
        data.validate()


def test_bad_augment_fields():
    with pytest.raises(ConfigError, match="data.augment.crop_padding must be >= 0"):
        digits_train(crop_padding=-1).validate()
    with pytest.raises(ConfigError, match="data.augment.mean=.*and data.augment.std=.*one value per channel"):
        digits_train(mean=(0.5,)).validate()
    with pytest.raises(ConfigError, match="data.augment.std=.*must be > 0"):
        digits_train(mean=(0.5,), std=(0.0,)).validate()
    with pytest.raises(ConfigError, match="data.augment.crop_padding=8 is not smaller than the images' 8x8"):
        digits_train(crop_padding=8).validate()


def test_example_from_file_reads_an_image_or_an_array_as_the_sources_would(tmp_path):
    """decode.inputs: a PNG decoded to the model's channels and scaled to 0..1, then the data's
    normalisation; a .npy array of the input shape as it is; wrong sizes and non-images named."""
    from PIL import Image

    from pax_eqx.data.images import example_from_file

    pixels = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(pixels).save(tmp_path / "gray.png")
    got = example_from_file(str(tmp_path / "gray.png"), (3, 4, 1), AugmentConfig())["inputs"]
    np.testing.assert_allclose(got, pixels[..., None] / 255.0, rtol=1e-6)
    normalized = example_from_file(str(tmp_path / "gray.png"), (3, 4, 1), AugmentConfig(mean=(0.5,), std=(0.25,)))
    np.testing.assert_allclose(normalized["inputs"], (pixels[..., None] / 255.0 - 0.5) / 0.25, rtol=1e-5)
    rgb = example_from_file(str(tmp_path / "gray.png"), (3, 4, 3), AugmentConfig())["inputs"]
    assert rgb.shape == (3, 4, 3)
    np.save(tmp_path / "x.npy", np.ones((64,), np.float32))
    assert example_from_file(str(tmp_path / "x.npy"), (64,), AugmentConfig())["inputs"].shape == (64,)
    with pytest.raises(ConfigError, match=r"4x3 \(width x height\), but the model takes 8x8"):
        example_from_file(str(tmp_path / "gray.png"), (8, 8, 1), AugmentConfig())
    with pytest.raises(ConfigError, match=r"shape \(64,\), but the model takes \(8, 8, 1\)"):
        example_from_file(str(tmp_path / "x.npy"), (8, 8, 1), AugmentConfig())
    with pytest.raises(ConfigError, match="not images"):
        example_from_file(str(tmp_path / "gray.png"), (64,), AugmentConfig())
    (tmp_path / "text.png").write_text("not a picture")
    with pytest.raises(ConfigError, match="text.png.*not a readable image"):
        example_from_file(str(tmp_path / "text.png"), (3, 4, 1), AugmentConfig())
    with pytest.raises(ConfigError, match="missing.png.*not a file"):
        example_from_file(str(tmp_path / "missing.png"), (3, 4, 1), AugmentConfig())
