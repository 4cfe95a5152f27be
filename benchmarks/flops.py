"""MFU arithmetic: model FLOPs per token (PaLM), hardware FLOPs under remat, device peaks.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B):

    model_flops_per_token = 6 * N + 12 * L * d * S

- N is the **total** trainable parameter count, embeddings included. PaLM counts all of its
  540B parameters (its input embedding is tied to the softmax, whose matmul is real work);
  the 52% MFU for GPT3-XL in issue 7 / DESIGN.md section 5 is computed with this N
  (GPT3-XL, V=50304: N = 1,315,819,520, of which 103M are the tied embedding and 4.2M the
  learned position table; with the non-embedding N the same run would read about 48%).
- 6N: every parameter takes part in one multiply-add (2 FLOPs) per token in the forward pass
  and two in the backward pass (gradients w.r.t. activations and w.r.t. weights).
- 12 * L * d * S is the attention score and value matmuls (QK^T and PV: 2 * 2 * S * d FLOPs
  per token per layer forward, x3 for forward + backward), with d = heads x head dims. It is
  **not halved for causal masking**, as in PaLM: a causal flash-attention kernel executes
  about half of it, so MFU with this convention reads slightly high (GPT3-XL at S=2048:
  the term is 13% of the total, so up to ~7% of the reported MFU is masked-out work).
- Non-matmul work (LayerNorm, GELU, softmax, the optimizer update) is not counted; neither
  term changes with batch size.

Hardware FLOPs (HFU) also count what remat recomputes in the backward pass; see
`hardware_flops_per_token`. MFU = achieved model FLOP/s / peak FLOP/s.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s per device, from the vendors' datasheets.
# Matched against `jax.Device.device_kind` by substring, in this order (the first match wins,
# so the more specific names come first).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM, e.g. "NVIDIA H100 80GB HBM3"
    ("H200", 989.4),  # "NVIDIA H200", "NVIDIA GH200 ..."
    ("A100", 312.0),  # SXM and PCIe
    ("TPU v4", 275.0),
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5p", 459.0),
    ("TPU v5", 459.0),  # v5p reports "TPU v5"
    ("TPU v6 lite", 918.0),  # v6e (Trillium)
)

# For each remat policy name: which forward work the backward pass recomputes.
#   "layers": the whole forward of every layer inside the checkpoint (projections + attention)
#   "attention": only the attention score/value products (batched dots, or the fused kernel)
#   "attention_if_fused": the attention only when it runs as a fused kernel (cuDNN), which no
#                         dot-based policy can save
#   "attention_unless_fused": the attention only when it runs as XLA dots (the policy saves the
#                         fused kernel's outputs but not batched dots)
#   "nothing": no matmul is recomputed
_RECOMPUTED: dict[str, str] = {
    "none": "nothing",
    "everything_saveable": "nothing",
    "dots_saveable": "attention_if_fused",
    "checkpoint_dots": "attention_if_fused",
    "dots_with_no_batch_dims_saveable": "attention",
    "checkpoint_dots_with_no_batch_dims": "attention",
    # Also saves the fused kernel's forward outputs (output + softmax statistics); with XLA
    # attention the batched score/value dots are still recomputed.
    "dots_with_no_batch_dims_and_context": "attention_unless_fused",
    # Upper bounds: the projections and MLP are recomputed, the saved attention output is not.
    "save_context_and_out_proj": "layers",
    "save_qkv_context_and_out_proj": "layers",
    "full": "layers",
    "nothing_saveable": "layers",
}


def model_flops_per_token(num_params: int, num_layers: int, model_dims: int, seq_len: int) -> float:
    """PaLM's 6N + 12*L*d*S training FLOPs per token (N = total params; see the module doc)."""
    return 6.0 * num_params + 12.0 * num_layers * model_dims * seq_len


def attention_flops_per_token(num_layers: int, model_dims: int, seq_len: int) -> float:
    """Forward-pass FLOPs of the attention products, per token: 2 matmuls x 2 x S x d, per layer."""
    return 4.0 * num_layers * model_dims * seq_len


def hardware_flops_per_token(
    num_params: int,
    num_layers: int,
    model_dims: int,
    seq_len: int,
    remat_policy: str,
    *,
    layer_params: int | None = None,
    attention_impl: str = "cudnn",
) -> float:
    """Model FLOPs plus the matmul FLOPs the backward pass recomputes under `remat_policy`.

    Approximation: only matmuls are counted, and the recomputation is read off the policy, not
    off the compiled program (XLA may save or recompute more than the policy asks):

    - "none", "everything_saveable": nothing recomputed; HFU FLOPs = model FLOPs.
    - "dots_with_no_batch_dims_saveable": the projection and MLP outputs (dots without batch
      dims) are saved; the attention products (batched dots, or the fused cuDNN kernel) are
      recomputed: + 4*L*d*S.
    - "dots_saveable": every dot is saved; with XLA attention nothing matmul-sized is
      recomputed, with cuDNN attention (a custom call, not a dot) the kernel is: + 4*L*d*S.
    - "dots_with_no_batch_dims_and_context": as dots_with_no_batch_dims_saveable, but the fused
      cuDNN kernel's outputs are saved too: nothing recomputed with cuDNN, + 4*L*d*S with XLA.
    - "full" / "nothing_saveable": the layers' whole forward is recomputed:
      + 2 * layer_params + 4*L*d*S, i.e. 8N + 16*L*d*S when every parameter sits in the layers.

    layer_params: parameters inside the checkpointed layers (the embedding and softmax are
      outside the scan and not recomputed). None counts all of num_params, an upper bound.
    attention_impl: "cudnn" or "xla"; matters for "dots_saveable" and
      "dots_with_no_batch_dims_and_context".

    Not counted: flash attention's own recomputation of the scores in its backward kernel
    (part of the kernel's algorithm, not of remat).
    """
    if remat_policy not in _RECOMPUTED:
        raise ValueError(f"remat_policy={remat_policy!r} is unknown; use one of {sorted(_RECOMPUTED)}.")
    if attention_impl not in ("cudnn", "xla"):
        raise ValueError(f"attention_impl={attention_impl!r} is unknown; use 'cudnn' or 'xla'.")
    flops = model_flops_per_token(num_params, num_layers, model_dims, seq_len)
    attention = attention_flops_per_token(num_layers, model_dims, seq_len)
    recomputed = _RECOMPUTED[remat_policy]
    if recomputed == "layers":
        flops += 2.0 * (num_params if layer_params is None else layer_params) + attention
    elif (
        recomputed == "attention"
        or (recomputed == "attention_if_fused" and attention_impl == "cudnn")
        or (recomputed == "attention_unless_fused" and attention_impl == "xla")
    ):
        flops += attention
    return flops


def peak_tflops(device_kind: str) -> float | None:
    """Dense bf16 peak TFLOP/s of one device of this `device_kind`; None when unknown (e.g. CPU).

    >>> peak_tflops("NVIDIA H100 80GB HBM3")
    989.4
    """
    for name, tflops in PEAK_BF16_TFLOPS:
        if name.lower() in device_kind.lower():
            return tflops
    return None


def measure_cpu_peak_tflops(size: int = 1024, repeats: int = 5, dtype=jnp.float32) -> float:
    """Achieved TFLOP/s of a jitted [size, size] @ [size, size] matmul on the default device.

    A stand-in peak for CPUs, which have no datasheet number here: it is the best matmul
    throughput this process gets (all cores XLA uses), so an MFU against it reads how close
    the model gets to this machine's own matmul speed. Best of `repeats` timed runs.
    """
    if size <= 0 or repeats <= 0:
        raise ValueError(f"measure_cpu_peak_tflops needs size > 0 and repeats > 0, got {size=}, {repeats=}.")
    keys = jax.random.split(jax.random.key(0))
    a = jax.random.normal(keys[0], (size, size), dtype)
    b = jax.random.normal(keys[1], (size, size), dtype)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best / 1e12


def rate_text(tflops_per_s: float) -> str:
    """A FLOP rate in the unit that fits it: a CPU's 0.2 TF/s reads "210 GF/s", not "0.2 TF/s"
    (or "0.0 TF/s" at one decimal)."""
    if tflops_per_s >= 1.0:
        return f"{tflops_per_s:,.1f} TF/s"
    return f"{tflops_per_s * 1e3:,.1f} GF/s"


def load_note(cores: int | None = None) -> str:
    """ "" on an idle machine; else a sentence saying the measured peak and MFU are unreliable:
    other processes running during the measurement slow the peak's matmuls and the step by
    different amounts (a loaded machine has read MFU 91%). From the 1-minute load average."""
    import os

    cores = cores or os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform
        return ""
    if load <= 0.5 * cores:
        return ""
    return (
        f"the machine's load average was {load:.1f} on {cores} cores during the measurement: the measured peak and "
        "the MFU are unreliable; measure on an idle machine"
    )


def mfu(tokens_per_s: float, flops_per_token: float, peak: float, num_devices: int = 1) -> float:
    """Utilization: tokens_per_s * flops_per_token / (peak TFLOP/s per device * 1e12 * num_devices).

    tokens_per_s is the global throughput (all devices). Pass model FLOPs for MFU, hardware
    FLOPs for HFU.
    """
    if peak <= 0 or num_devices <= 0:
        raise ValueError(f"mfu needs peak > 0 and num_devices > 0, got {peak=}, {num_devices=}.")
    return tokens_per_s * flops_per_token / (peak * 1e12 * num_devices)


# --- Convolutional networks -------------------------------------------------------------------


def conv_taps(size: int, kernel: int, stride: int, count_padding: bool = True) -> tuple[int, int]:
    """(output size, window taps summed over the output positions) of one spatial dimension of a
    "SAME"-padded convolution (or pooling) of `size` pixels.

    With count_padding (the usual convention) every output position sees all `kernel` taps:
    out * kernel. Without it only taps on real pixels count, not the zero padding, which is what
    XLA's cost analysis and `benchmarks.hlo_ops` count.
    """
    out = -(-size // stride)
    if count_padding:
        return out, out * kernel
    lo = max((out - 1) * stride + kernel - size, 0) // 2
    taps = sum(1 for o in range(out) for k in range(kernel) if 0 <= o * stride + k - lo < size)
    return out, taps


def resnet_flops_per_image(cfg, input_shape: tuple[int, int, int], num_classes: int = 0, count_padding: bool = True):
    """Forward FLOPs of one image through a ResNet (`pax_eqx.layers.resnets.ResNetConfig`) and a
    `num_classes` linear head, counting each multiply-add as 2 FLOPs.

    Counted: every convolution, 2 * H_out * W_out * kh * kw * C_in * C_out (the stem, the blocks'
    convolutions and their 1x1 projection shortcuts; no grouped convolutions in a ResNet), and
    the head's matmul, 2 * F * num_classes. Not counted: BatchNorm, ReLU, the stem's max pool,
    the global average pool, the residual adds, the head's bias and the softmax (elementwise or
    reduction work, well under 1% of ResNet-50's). `count_padding=False` counts only the taps
    that land on real pixels, XLA's convention (see `conv_taps`).

    input_shape: (height, width, channels). A training step is about 3x this (forward, and the
    backward's input- and weight-gradient convolutions), less the first convolution's input
    gradient, which nothing needs.
    """
    height, width, channels = input_shape
    total = 0

    def conv(h: int, w: int, c_in: int, c_out: int, kernel: int, stride: int) -> tuple[int, int]:
        nonlocal total
        h_out, taps_h = conv_taps(h, kernel, stride, count_padding)
        w_out, taps_w = conv_taps(w, kernel, stride, count_padding)
        total += 2 * taps_h * taps_w * c_in * c_out
        return h_out, w_out

    imagenet = cfg.stem == "imagenet"
    h, w = conv(height, width, channels, cfg.stem_channels, 7 if imagenet else 3, 2 if imagenet else 1)
    if imagenet:  # the 3x3 stride-2 "SAME" max pool
        h, w = -(-h // 2), -(-w // 2)
    c = cfg.stem_channels
    k = cfg.block.kernel_size
    for num_blocks, c_out, stage_stride in zip(cfg.blocks, cfg.channels, cfg.strides):
        for j in range(num_blocks):
            stride = stage_stride if j == 0 else 1
            if cfg.block.bottleneck:
                width_ = c_out // 4
                conv(h, w, c, width_, 1, 1)
                h2, w2 = conv(h, w, width_, width_, k, stride)
                conv(h2, w2, width_, c_out, 1, 1)
            else:
                h2, w2 = conv(h, w, c, c_out, k, stride)
                conv(h2, w2, c_out, c_out, k, 1)
            if stride != 1 or c != c_out:
                conv(h, w, c, c_out, 1, stride)  # projection shortcut
            h, w, c = h2, w2, c_out
    return total + 2 * c * num_classes


def resnet_first_conv_flops(cfg, input_shape: tuple[int, int, int], count_padding: bool = True) -> int:
    """Forward FLOPs of the stem convolution alone: what a training step does not repeat for the
    images' gradient (the images are not differentiated, so that input-gradient conv never runs)."""
    height, width, channels = input_shape
    imagenet = cfg.stem == "imagenet"
    kernel, stride = (7, 2) if imagenet else (3, 1)
    taps_h = conv_taps(height, kernel, stride, count_padding)[1]
    taps_w = conv_taps(width, kernel, stride, count_padding)[1]
    return 2 * taps_h * taps_w * channels * cfg.stem_channels
