"""`python -m benchmarks.images [--exp NAME] [--resnet50] [--image-size S] [--steps N] [--warmup N]
[--no-reference] [--a.b VALUE ...]`

Images/s and MFU of an image classifier's real train step (the `Programs.train_step` the trainer
runs: sharded, donated, BatchNorm state and all) on synthetic images [batch, S, S, C] and labels
(deterministic random), the sibling of `benchmarks.mfu` for a ResNet. Prints a human summary
and, as its last line, one JSON object:

    exp, device_kind, num_devices, params, images_per_step, step_time_s (median), images_per_s,
    flops_per_image, hlo_flops_per_image, hlo_expected_flops_per_image, model_tflops_per_s,
    mfu, peak_tflops, compile_s, reference_step_time_s, ratio_to_reference, reference_mismatch

- flops_per_image: the analytic training FLOPs, 3 x the forward's
  (`flops.resnet_flops_per_image`: every convolution and the head's matmul, a multiply-add is
  2 FLOPs, padding taps included, BatchNorm / ReLU / pooling / adds not counted). ResNet-50 at
  224x224: 3 x 8,178,368,512.
- hlo_flops_per_image: the convolution and matmul FLOPs of the compiled step
  (`benchmarks.hlo_ops`), x devices / images: what XLA actually runs. It is a little less than
  flops_per_image, exactly by what `hlo_expected_flops_per_image` accounts for: XLA counts only
  the taps on real pixels (not the zero padding), and the stem convolution's input gradient is
  never computed (the images need no gradient), so expected = 3 x forward (real-pixel taps) -
  stem convolution (real-pixel taps). ResNet-50 at 224: 0.956 x flops_per_image.
- mfu: images_per_s x flops_per_image / (peak x devices), where the device's datasheet peak
  is known (`flops.peak_tflops`, GPU/TPU bf16); None on CPU.
- ratio_to_reference: step_time_s / reference_step_time_s, the step of a hand-written plain-JAX
  ResNet-50 (`benchmarks/reference_resnet.py`, no pax_eqx imports) timed after pax_eqx's in the
  same process on the same global batch (same images and labels), dtype, BatchNorm and optimizer
  (`--no-reference` skips it). Only for a ResNet-50 network; otherwise `reference_mismatch` says
  why and there is no ratio.

`--exp` defaults to `imagenet_resnet50` when that experiment is registered, else
`digits_resnet`; `--resnet50` swaps any classifier's network for `resnet50()` on 224x224x3
images with 1000 classes (then e.g. `--data.train.batch-size 2`); `--image-size S` sets the
images' height and width (keeping their channels).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

import jax
import numpy as np

from benchmarks import flops, hlo_ops
from benchmarks.mfu import compile_and_time, time_steps
from benchmarks.reference_resnet import ResNetReferenceConfig, make_train_step
from pax_eqx.command_line import cli
from pax_eqx.experiment import ExperimentConfig

IMAGENET_EXP, FALLBACK_EXP = "imagenet_resnet50", "digits_resnet"


def default_experiment() -> str:
    """`imagenet_resnet50` when registered, else `digits_resnet`."""
    from pax_eqx.command_line import registry

    try:
        registry.load_experiment(IMAGENET_EXP)
    except registry.UnknownExperimentError:
        return FALLBACK_EXP
    return IMAGENET_EXP


def as_resnet50(exp: ExperimentConfig, image_size: int = 224) -> ExperimentConfig:
    """The experiment with ResNet-50 on image_size x image_size x 3 images and 1000 classes."""
    from pax_eqx.layers.resnets import resnet50

    model = exp.model.replace(network=resnet50(), input_shape=(image_size, image_size, 3), num_classes=1000)
    return exp.replace(model=model)


def with_image_size(exp: ExperimentConfig, image_size: int) -> ExperimentConfig:
    *_, channels = exp.model.input_shape
    return exp.replace(model=exp.model.replace(input_shape=(image_size, image_size, channels)))


def on_synthetic_images(exp: ExperimentConfig) -> ExperimentConfig:
    """The experiment reading what this benchmark feeds it: synthetic images of the model's
    input shape (its own source, the digits say, would be refused for another shape)."""
    from pax_eqx.data import SyntheticImagesSource

    source = SyntheticImagesSource(image_shape=tuple(exp.model.input_shape), augment=exp.data.source.normalization)
    return exp.replace(data=exp.data.replace(source=source))


def synthetic_images(batch: int, shape: tuple[int, ...], num_classes: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "inputs": rng.standard_normal((batch, *shape), dtype=np.float32),
        "labels": rng.integers(0, num_classes, (batch,)).astype(np.int32),
        "weights": np.ones((batch,), np.float32),
    }


def synthetic_image_step(exp: ExperimentConfig) -> tuple[Any, Any, dict[str, jax.Array]]:
    """(programs, train state, global batch): the experiment's real train step on synthetic images."""
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.mesh import build_mesh

    exp = on_synthetic_images(exp)
    exp.validate(num_devices=jax.device_count())
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    state = programs.init_state(exp.train.seed)
    local = synthetic_images(exp.data.train.batch_size, tuple(exp.model.input_shape), exp.model.num_classes)
    return programs, state, programs.global_batch(local)


def analytic_flops(exp: ExperimentConfig) -> dict[str, float]:
    """forward (padding taps counted, the convention), train (3 x forward), and what the compiled
    step's convolutions and matmuls add up to (`hlo_expected`: real-pixel taps, no stem input gradient)."""
    network, shape, classes = exp.model.network, tuple(exp.model.input_shape), exp.model.num_classes
    forward = flops.resnet_flops_per_image(network, shape, classes)
    forward_real = flops.resnet_flops_per_image(network, shape, classes, count_padding=False)
    stem_real = flops.resnet_first_conv_flops(network, shape, count_padding=False)
    return {"forward": forward, "train": 3 * forward, "hlo_expected": 3 * forward_real - stem_real}


def hlo_flops(hlo_text: str) -> float:
    """Convolution + matmul FLOPs of one call of a compiled module (one device's program)."""
    return sum(op.flops * op.executions for op in hlo_ops.index_module(hlo_text).values())


def reference_differences(exp: ExperimentConfig) -> list[str]:
    """What keeps the plain-JAX ResNet-50 from timing the experiment's model (empty: nothing).
    zero_init_residual and the head's init change only the initial values, not the step."""
    from pax_eqx.layers.resnets import resnet50

    net, learner = exp.model.network, exp.learner
    block = net.block.replace(zero_init_residual=False, batch_norm_decay=0.9, batch_norm_epsilon=1e-3)
    checks = [
        (net.replace(block=block) == resnet50(), "model.network is not ResNet-50 (the reference's only network)"),
        (len(exp.model.input_shape) == 3 and exp.model.input_shape[0] == exp.model.input_shape[1],
         f"model.input_shape={tuple(exp.model.input_shape)} (the reference takes square images)"),
        (learner.optimizer.kind in ("sgd", "adam", "adamw"), f"learner.optimizer {learner.optimizer.kind!r}"),
        (learner.weight_decay_mask == "matrices", f"learner.weight_decay_mask={learner.weight_decay_mask!r}"),
        (learner.clip_grad_norm == 0 and learner.clip_update_rms == 0, "learner gradient or update clipping"),
        (not learner.skip_nonfinite and learner.ema_decay == 0, "learner.skip_nonfinite or learner.ema_decay"),
        (not learner.frozen and not learner.variable_groups and learner.num_microbatches == 1,
         "learner frozen parameters, variable groups or microbatches"),
    ]  # fmt: skip
    return [what for ok, what in checks if not ok]


def reference_config(exp: ExperimentConfig, batch: int) -> ResNetReferenceConfig:
    """The plain-JAX ResNet-50 of the experiment's shapes, dtype, BatchNorm and optimizer."""
    m, learner, block = exp.model, exp.learner, exp.model.network.block
    return ResNetReferenceConfig(
        num_classes=m.num_classes, image_size=m.input_shape[0], channels=m.input_shape[-1], batch_size=batch,
        dtype=exp.train.fprop_dtype, bn_decay=block.batch_norm_decay, bn_epsilon=block.batch_norm_epsilon,
        zero_init_residual=block.zero_init_residual, label_smoothing=m.label_smoothing_prob,
        optimizer=learner.optimizer.kind, learning_rate=learner.learning_rate,
        l2_regularization=learner.l2_regularization, weight_decay=learner.weight_decay,
        **{k: getattr(learner.optimizer, k) for k in ("momentum", "nesterov", "b1", "b2", "eps")
           if hasattr(learner.optimizer, k)},
    )  # fmt: skip


def time_reference(exp: ExperimentConfig, images: int, steps: int, warmup: int) -> float:
    """Median step seconds of the plain-JAX ResNet-50 on the global batch pax_eqx's step ran."""
    init_fn, step = make_train_step(reference_config(exp, images))
    local = synthetic_images(images, tuple(exp.model.input_shape), exp.model.num_classes)  # the same arrays
    batch = {"images": local["inputs"], "labels": local["labels"]}
    times, _ = time_steps(lambda s: step(s, batch), init_fn(jax.random.key(0)), warmup + 1, steps)
    return float(np.median(times))


def run(exp: ExperimentConfig, steps: int, warmup: int, with_reference: bool = True, log=print) -> dict[str, Any]:
    from pax_eqx.layers.resnets import ResNetConfig

    if not isinstance(exp.model.network, ResNetConfig):
        raise cli.fail(
            f"benchmarks.images counts a ResNet's FLOPs; --exp {exp.name}'s network is a "
            f"{type(exp.model.network).__name__}. Use a ResNet experiment (e.g. --exp digits_resnet) or --resnet50."
        )
    images = exp.data.train.batch_size * jax.process_count()
    programs, state, data = synthetic_image_step(exp)
    compiled, compile_s, step_time, state = compile_and_time(programs, state, data, warmup, steps)
    n_dev = jax.device_count()
    # The module is one device's program; data parallel, each device runs its share of the images.
    hlo_per_image = hlo_flops(compiled.as_text()) * n_dev / images

    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    analytic = analytic_flops(exp)
    images_per_s = images / step_time
    device = jax.devices()[0]
    peak = flops.peak_tflops(device.device_kind)
    result = {
        "exp": exp.name,
        "device_kind": device.device_kind,
        "num_devices": n_dev,
        "params": int(num_params),
        "image_shape": list(exp.model.input_shape),
        "images_per_step": images,
        "step_time_s": step_time,
        "images_per_s": images_per_s,
        "flops_per_image": analytic["train"],
        "forward_flops_per_image": analytic["forward"],
        "hlo_flops_per_image": hlo_per_image,
        "hlo_expected_flops_per_image": analytic["hlo_expected"],
        "model_tflops_per_s": images_per_s * analytic["train"] / 1e12,
        "mfu": flops.mfu(images_per_s, analytic["train"], peak, n_dev) if peak else None,
        "peak_tflops": peak,
        "compile_s": compile_s,
        "reference_step_time_s": None,
        "ratio_to_reference": None,
        "reference_mismatch": reference_differences(exp) if with_reference else [],
    }
    del programs, state, data, compiled  # free pax_eqx's step before the reference runs
    if with_reference and not result["reference_mismatch"]:
        result["reference_step_time_s"] = time_reference(exp, images, steps, warmup)
        result["ratio_to_reference"] = step_time / result["reference_step_time_s"]
    _print_summary(result, log)
    return result


def _print_summary(r: dict[str, Any], log) -> None:
    shape = "x".join(map(str, r["image_shape"]))
    log(f"{r['exp']} on {r['num_devices']} x {r['device_kind']}: {r['params'] / 1e6:,.2f}M params, {shape} images")
    log(f"  step {r['step_time_s'] * 1e3:,.1f} ms (median), {r['images_per_s']:,.2f} images/s, "
        f"{r['model_tflops_per_s']:,.3f} model TFLOP/s, compile {r['compile_s']:.1f} s")  # fmt: skip
    log(f"  FLOPs per image: forward {r['forward_flops_per_image']:,.0f} ({r['forward_flops_per_image'] / 2e9:.3f} "
        f"GMACs), train step 3x = {r['flops_per_image']:,.0f}")  # fmt: skip
    log(f"  compiled HLO conv+matmul FLOPs per image {r['hlo_flops_per_image']:,.0f} "
        f"({r['hlo_flops_per_image'] / r['flops_per_image']:.4f} of 3x forward; expected "
        f"{r['hlo_expected_flops_per_image']:,.0f}: real-pixel taps, no stem input gradient)")  # fmt: skip
    if r["mfu"] is not None:
        log(f"  MFU {r['mfu'] * 100:.1f}% (peak {r['peak_tflops']:.1f} TF/s per device, datasheet bf16)")
    if r["reference_step_time_s"]:
        log(f"  plain-JAX ResNet-50 reference {r['reference_step_time_s'] * 1e3:,.1f} ms (same batch, dtype, "
            f"optimizer): ratio {r['ratio_to_reference']:.3f}")  # fmt: skip
    if r["reference_mismatch"]:
        log("  no ratio to the plain-JAX reference: " + "; ".join(r["reference_mismatch"]))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--exp" or a.startswith("--exp=") for a in argv):
        argv = ["--exp", default_experiment(), *argv]
    exp, _, ns = cli.parse(
        argv,
        "python -m benchmarks.images",
        "Images/s and MFU of an image classifier's train step on synthetic images.",
        job_dir_required=False,
        extra=[
            ("--steps", dict(type=int, default=10)),
            ("--warmup", dict(type=int, default=2)),
            ("--image-size", dict(type=int, default=None)),
            ("--resnet50", dict(action="store_true")),
            ("--no-reference", dict(action="store_true")),
        ],
    )
    if ns.steps <= 0 or ns.warmup < 0:
        raise cli.fail(f"--steps must be > 0 and --warmup >= 0, got {ns.steps} and {ns.warmup}.")
    if ns.resnet50:
        exp = as_resnet50(exp, ns.image_size or 224)
    elif ns.image_size:
        exp = with_image_size(exp, ns.image_size)
    result = run(exp, ns.steps, ns.warmup, not ns.no_reference)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from pax_eqx.command_line import entry

    entry.run(lambda: main(sys.argv[1:]))
