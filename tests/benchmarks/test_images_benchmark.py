"""`benchmarks.images` and the FLOP counts under it: a ResNet's analytic FLOPs by hand and against
the published numbers, the HLO's convolution FLOPs against the formula (strided, grouped,
padded, and their gradients), and the compiled train step's conv+matmul FLOPs against the
analytic count exactly; the command as a CPU smoke run."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import flops, hlo_ops, images
from pax_eqx.command_line import cli
from pax_eqx.layers.resnets import ResNetBlockConfig, ResNetConfig, resnet18, resnet50

TINY = ResNetConfig(
    blocks=(1, 1), channels=(8, 8), strides=(1, 2), stem="small", stem_channels=8, block=ResNetBlockConfig()
)
TINY_EXP = [
    "--exp", "digits_resnet", "--model.network.blocks", "1", "1", "--model.network.channels", "8", "8",
    "--model.network.strides", "1", "2", "--model.network.stem-channels", "8", "--model.input-shape", "16", "16", "1",
    "--data.train.batch-size", "16", "--mesh.ici-mesh-shape", "8", "1", "1",
]  # fmt: skip
KEYS = {
    "exp", "device_kind", "num_devices", "params", "images_per_step", "step_time_s", "images_per_s",
    "flops_per_image", "hlo_flops_per_image", "hlo_expected_flops_per_image", "mfu", "compile_s",
}  # fmt: skip


def test_tiny_resnet_forward_flops_by_hand():
    stem = 2 * 16 * 16 * 9 * 1 * 8  # 3x3 conv, 1 -> 8 channels, 16x16
    stage0 = 2 * (2 * 16 * 16 * 9 * 8 * 8)  # a basic block's two 3x3 convs at 16x16
    stage1 = 2 * (2 * 8 * 8 * 9 * 8 * 8) + 2 * 8 * 8 * 8 * 8  # stride 2: two 3x3 convs at 8x8 + 1x1 shortcut
    head = 2 * 8 * 10
    assert flops.resnet_flops_per_image(TINY, (16, 16, 1), 10) == stem + stage0 + stage1 + head == 782_496


def test_resnet50_and_18_at_224_match_the_published_gmacs():
    # ~4.1 GMACs (torchvision: 4.09 "GFLOPS", i.e. multiply-adds) and 1.81 for ResNet-18
    r50 = flops.resnet_flops_per_image(resnet50(), (224, 224, 3), 1000)
    assert r50 == 8_178_368_512 and round(r50 / 2e9, 2) == 4.09
    assert round(flops.resnet_flops_per_image(resnet18(), (224, 224, 3), 1000) / 2e9, 2) == 1.81
    # taps on real pixels only (XLA's count): 3.4% fewer
    real = flops.resnet_flops_per_image(resnet50(), (224, 224, 3), 1000, count_padding=False)
    assert real == 7_896_503_808


def test_conv_taps_with_and_without_padding():
    assert flops.conv_taps(16, 3, 1) == (16, 48)
    assert flops.conv_taps(16, 3, 1, count_padding=False) == (16, 46)  # the two edge taps on padding
    # SAME pads 2 before, 3 after: 2 padding taps at the first output, 3 + 1 at the last two
    assert flops.conv_taps(224, 7, 2, count_padding=False) == (112, 112 * 7 - 6)
    assert flops.conv_taps(16, 1, 2, count_padding=False) == (8, 8)


def test_hlo_convolution_flops_of_a_strided_and_a_grouped_conv_and_their_gradients():
    def f(w1, w2, x):
        y = jax.lax.conv_general_dilated(x, w1, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = jax.lax.conv_general_dilated(
            jax.nn.relu(y), w2, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=2
        )
        return (y**2).sum()

    w1, w2, x = jnp.ones((3, 3, 3, 8)), jnp.ones((3, 3, 4, 8)), jnp.ones((4, 16, 16, 3))
    strided = 2 * 4 * flops.conv_taps(16, 3, 2, False)[1] ** 2 * 3 * 8
    grouped = 2 * 4 * flops.conv_taps(8, 3, 1, False)[1] ** 2 * 4 * 8  # 4 input features per group

    forward = hlo_ops.index_module(jax.jit(f).lower(w1, w2, x).compile().as_text())
    convs = [op for op in forward.values() if op.category == "convolution"]
    assert sorted(op.flops for op in convs) == sorted([strided, grouped])
    # The gradient w.r.t. the weights: both forward convs, both weight gradients (XLA rewrites the
    # grouped one as a 3-d convolution with lhs_dilate), the second conv's input gradient; x gets none.
    grad = hlo_ops.index_module(jax.jit(jax.grad(f, argnums=(0, 1))).lower(w1, w2, x).compile().as_text())
    assert sum(op.flops * op.executions for op in grad.values()) == 2 * strided + 3 * grouped
    # With x differentiated too, the strided conv's input gradient (an lhs-dilated conv whose
    # holes are not multiply-adds) costs exactly its forward again.
    full = hlo_ops.index_module(jax.jit(jax.grad(f, argnums=(0, 1, 2))).lower(w1, w2, x).compile().as_text())
    assert sum(op.flops * op.executions for op in full.values()) == 3 * strided + 3 * grouped


def test_a_cudnn_convolution_custom_call_counts_its_forward_convolution():
    forward = 2 * 8 * 64 * flops.conv_taps(16, 3, 1, False)[1] ** 2 * 3  # batch x out features x taps x in
    text = """HloModule m

ENTRY %main (p0: f32[8,16,16,3], p1: f32[64,3,3,3], p2: f32[8,16,16,64]) -> f32[8,16,16,3] {
  %p0 = f32[8,16,16,3]{3,2,1,0} parameter(0)
  %p1 = f32[64,3,3,3]{3,2,1,0} parameter(1)
  %p2 = f32[8,16,16,64]{3,2,1,0} parameter(2)
  %fwd = (f32[8,16,16,64]{3,2,1,0}, u8[0]{0}) custom-call(f32[8,16,16,3]{3,2,1,0} %p0, f32[64,3,3,3]{3,2,1,0} %p1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward"
  %bwd = (f32[8,16,16,3]{3,2,1,0}, u8[0]{0}) custom-call(f32[8,16,16,64]{3,2,1,0} %p2, f32[64,3,3,3]{3,2,1,0} %p1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardInput"
  %wgt = (f32[64,3,3,3]{3,2,1,0}, u8[0]{0}) custom-call(f32[8,16,16,3]{3,2,1,0} %p0, f32[8,16,16,64]{3,2,1,0} %p2), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardFilter"
  ROOT %out = f32[8,16,16,3]{3,2,1,0} get-tuple-element(%bwd), index=0
}
"""  # noqa: E501
    ops = hlo_ops.index_module(text)
    assert {name: (ops[name].category, ops[name].flops) for name in ("fwd", "bwd", "wgt")} == {
        name: ("convolution", forward) for name in ("fwd", "bwd", "wgt")
    }


def test_compiled_resnet_train_step_flops_equal_the_analytic_count_exactly():
    """conv + matmul FLOPs of the compiled step = 3 x forward - the stem's input gradient, all in
    real-pixel taps: forward, input gradient and weight gradient of every conv and of the head,
    except the images' gradient, which nothing asks for."""
    exp, _, _ = cli.parse(TINY_EXP, "t", "", job_dir_required=False)
    assert exp.model.network == TINY
    programs, state, batch = images.synthetic_image_step(exp)
    per_device = images.hlo_flops(programs.train_step.lower(state, batch).compile().as_text())
    forward_real = flops.resnet_flops_per_image(TINY, (16, 16, 1), 10, count_padding=False)
    stem_real = flops.resnet_first_conv_flops(TINY, (16, 16, 1), count_padding=False)
    assert per_device * 8 == (3 * forward_real - stem_real) * 16  # data parallel: 2 images per device
    # The padding-inclusive convention is what the benchmark reports; on 16x16 images the padding is 10%.
    assert per_device * 8 / 16 == pytest.approx(0.8975 * 3 * flops.resnet_flops_per_image(TINY, (16, 16, 1), 10), 1e-3)


def test_images_benchmark_smoke_run_prints_a_summary_and_a_json_last_line(capsys):
    args = [*TINY_EXP, "--model.input-shape", "8", "8", "1", "--image-size", "16", "--steps", "2", "--warmup", "1"]
    assert images.main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert KEYS <= result.keys()
    assert result["exp"] == "digits_resnet" and result["num_devices"] == 8 and result["images_per_step"] == 16
    assert result["image_shape"] == [16, 16, 1] and result["mfu"] is None  # CPU: no datasheet peak
    assert result["flops_per_image"] == 3 * 782_496
    assert result["hlo_flops_per_image"] == result["hlo_expected_flops_per_image"]
    assert result["images_per_s"] == pytest.approx(16 / result["step_time_s"])
    assert any("images/s" in line for line in out[:-1])


def test_resnet50_shortcut_and_a_non_resnet_experiment():
    exp, _, _ = cli.parse(["--exp", "digits_resnet"], "t", "", job_dir_required=False)
    r50 = images.as_resnet50(exp)
    assert r50.model.input_shape == (224, 224, 3) and r50.model.num_classes == 1000
    assert r50.model.network == resnet50()
    with pytest.raises(cli.CliError):
        images.main(["--exp", "digits_mlp", "--steps", "1"])
