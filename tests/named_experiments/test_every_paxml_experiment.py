"""Every experiment Paxml 1.4 registers, against the table generated from Paxml itself.

tests/fixtures/paxml/experiments/paxml_1_4_experiments.json holds, for each of the 90 classes
paxml 1.4.0 registers in tasks/lm/params/{c4, c4_multislice, lm_cloud, nvidia, optimal_scaling,
bert}.py and tasks/vision/params/{imagenet_resnets, mnist}.py, what Paxml's own `task()` and
`datasets()` return (generate_paxml_table.py beside it reads them; nothing is typed in by hand).
For each class, `registry.load_experiment(<Class>)` must resolve (pax_eqx registers Pax's class
names as aliases) and every field below must equal Paxml's. A class pax_eqx does not register
fails, naming it; a class that resolves fails with one line naming every field that differs.

Configs only: no model is built, no array made.

Paxml's names map onto pax_eqx's as experiments/lm_cloud.py documents them (mesh axes,
per-core batch, CHECKPOINT_POLICY); where the mapping is not a rename it is one function below:
`remat_policy`, `learner_view` (Praxis optimizer -> LearnerConfig), `schedule_view` (Praxis
schedule -> ScheduleConfig), `global_batch`, `mesh_view`, `fprop_dtype`, `moe_layer_interval`.
A Paxml setting with no pax_eqx counterpart (say, Adafactor's clip_threshold other than 1.0)
is a difference naming the Paxml setting.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from experiments import registry
from pax_eqx.experiment import ExperimentConfig

TABLE_PATH = Path(__file__).parents[1] / "fixtures" / "paxml" / "experiments" / "paxml_1_4_experiments.json"
TABLE: dict[str, Any] = json.loads(TABLE_PATH.read_text())
SOURCE = TABLE.pop("_source")
NAMES = sorted(TABLE)


class NoCounterpart(str):
    """An expected value for a Paxml setting pax_eqx cannot express; never equal to anything."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


def none_for(what: str) -> NoCounterpart:
    """The expected value of a field whose Paxml setting (`what`) pax_eqx cannot express."""
    return NoCounterpart(f"<{what}: no pax_eqx counterpart>")


# Mapping functions: Paxml's value -> the pax_eqx value it must be -------------------------------
# Praxis AutodiffCheckpointType name -> pax_eqx remat policy (pax_eqx/layers/remat.py).
_REMAT = {
    "SAVE_NOTHING": "full",
    "SAVE_EVERYTHING": "everything_saveable",
    "SAVE_DOT_ONLY": "dots_saveable",
    "SAVE_DOT_WITH_NO_BATCH_DIM": "dots_with_no_batch_dims_saveable",
    "SAVE_CONTEXT_AND_OUT_PROJ": "save_context_and_out_proj",
    "SAVE_DOT_FOR_MLPERF_200B": "save_qkv_context_and_out_proj",
}


def remat_policy(model: dict[str, Any]) -> str:
    """pax_eqx's `model.remat_policy` for Paxml's stack.

    Praxis rematerialises only where a layer wraps the stack: the PipelinedTransformer's
    checkpoint_policy (each stage iteration) or else StackedTransformerRepeated's (each scanned
    layer); a plain StackedTransformer saves everything, pax_eqx's "none", whatever the class's
    CHECKPOINT_POLICY says. The policy names map by what they save (`_REMAT`; SAVE_NOTHING is
    jax's nothing_saveable, pax_eqx's "full").
    """
    if model["num_stages"]:
        policy = model["pipeline_checkpoint_policy"]
    elif model["use_repeated_layer"]:
        policy = model["checkpoint_policy"]
    else:
        return "full" if model["stack_remat"] else "none"
    return _REMAT.get(policy, none_for(f"Praxis checkpoint_policy {policy}"))


def mesh_view(mesh: dict[str, Any], exp: ExperimentConfig) -> dict[str, Any]:
    """pax_eqx's mesh for Paxml's. The axes are the same, in order: [replica, data, mdl] is
    (data, fsdp, tensor), [stage, replica, data, mdl] is (stage, data, fsdp, tensor); Paxml's None
    DCN shape is one slice, (1, ...) as long as the ICI shape. A pmap experiment has no mesh: it
    replicates the weights over however many devices run it, so pax_eqx's mesh must be pure data
    parallelism, (stage, data, fsdp, context, tensor) = (1, N, 1, 1, 1) for its own device count N
    (Paxml has no context axis: it is 1)."""
    ici, dcn = mesh["ici_mesh_shape"], mesh["dcn_mesh_shape"]
    if not ici:
        return {"mesh.shape": (1, exp.mesh.num_devices, 1, 1, 1)}
    return {"mesh.ici_mesh_shape": tuple(ici), "mesh.dcn_mesh_shape": tuple(dcn) if dcn else (1,) * len(ici)}


def global_batch(entry: dict[str, Any], exp: ExperimentConfig, split: int) -> int:
    """pax_eqx's per-host batch (one process drives every device) for Paxml's input `split`
    (0 train, 1 eval): the generator's global batch, Paxml's datasets() run on prod(ICI) x
    prod(DCN) devices. A pmap experiment has no mesh: its batch is per device, so on pax_eqx's
    mesh it is that times exp.mesh.num_devices."""
    data = entry["data"]
    batch = data["global_batch_size" if split == 0 else "eval_global_batch_size"]
    return batch if batch is not None else data["inputs"][split]["batch_size"] * exp.mesh.num_devices


def fprop_dtype(entry: dict[str, Any]) -> str:
    """Praxis' fprop_dtype None computes in the layer's dtype (its `dtype`, float32)."""
    return entry["fprop_dtype"] or entry["model_dtype"]


def moe_layer_interval(model: dict[str, Any]) -> int:
    """pax_eqx's `model.moe_layer_interval` (0 dense, n: layers 0, n, 2n, ...) for Praxis'
    num_experts / moe_layers: the step of moe_layers when it is 0, n, 2n, ... up to num_layers
    (Paxml lists every layer index, also for a repeated one-layer block)."""
    if not model["num_experts"]:
        return 0
    layers = sorted(model["moe_layers"] or [])
    step = layers[1] - layers[0] if len(layers) > 1 else model["num_layers"]
    if layers and layers == list(range(0, model["num_layers"], step)):
        return step
    return none_for(f"Praxis moe_layers {layers}")


def learner_view(optimizer: dict[str, Any], learner: dict[str, Any]) -> dict[str, Any]:
    """Praxis' optimizer (behind Paxml's Learner) as pax_eqx's LearnerConfig fields.

    - Adam (sharded_adam): optimizer adam (pax_eqx's adam and adamw both count: the weight decay
      is compared on its own), b1/b2/eps/eps_root = beta1/beta2/epsilon/epsilon_root,
      clip_update_rms = clip_threshold (<= 0: off, 0), weight_decay on every parameter
      (weight_decay_mask "all"); see pax_eqx.learners.pax_adam.
    - ShardedAdafactor: adafactor, decay_method, decay_rate = decay_adam or decay_pow, beta1,
      multiply_by_parameter_scale, factored_dims "last" (Praxis' default) or "largest"
      (sort_factored_second_moment_dims), momentum_dtype = quantized_dtype where beta1 > 0 (the
      momentum's storage; without momentum it stores nothing); Praxis' update clip at clip_threshold 1.0 is built into
      pax_eqx's Adafactor (clip_update_rms 0); weight_decay on every parameter.
    - ShardedSgd / Sgd: sgd, momentum (None: 0), nesterov. Lion: lion, b1, b2, clip_update_rms.
    - Every optimizer: learning_rate, clip_grad_norm = clip_gradient_norm_to_value,
      l2_regularization = l2_regularizer_weight (masked to matrices when skip_lp_1d_vectors),
      ema_decay, skip_nonfinite = the Learner's check_valid_step (skip a step whose gradient
      norm is NaN/Inf). A setting pax_eqx has no field for (single-tensor clipping, L1, decoupled
      weight decay, EWC, layerwise adaptation, the Learner's skip above a gradient norm) is a
      NoCounterpart when it is on.
    """
    o = optimizer
    cls = o["class"]
    view: dict[str, Any] = {}
    weight_decay = 0.0
    if cls == "Adam":
        view |= {"optimizer": "adam", "optimizer.b1": o["beta1"], "optimizer.b2": o["beta2"],
                 "optimizer.eps": o["epsilon"], "optimizer.eps_root": o["epsilon_root"],
                 "clip_update_rms": max(o["clip_threshold"], 0.0)}  # fmt: skip
        weight_decay = o["weight_decay"] or 0.0
    elif cls == "ShardedAdafactor":
        rate = o["decay_adam"] if o["decay_method"] == "adam" else o["decay_pow"]
        view |= {"optimizer": "adafactor", "optimizer.decay_method": o["decay_method"] or "pow",
                 "optimizer.decay_rate": rate, "optimizer.beta1": o["beta1"],
                 "optimizer.multiply_by_parameter_scale": o["multiply_by_parameter_scale"],
                 "optimizer.factored_dims": "largest" if o["sort_factored_second_moment_dims"] else "last"}  # fmt: skip
        if o["beta1"]:
            view["optimizer.momentum_dtype"] = o["quantized_dtype"]
        view["clip_update_rms"] = (
            0.0 if o["clip_threshold"] == 1.0 else none_for(f"ShardedAdafactor clip_threshold {o['clip_threshold']}")
        )
        if not o["factored"] or o["layerwise_adaptation"]:
            view["optimizer.factored"] = none_for("ShardedAdafactor factored=False / layerwise_adaptation")
        weight_decay = o["weight_decay"] or 0.0
    elif cls in ("ShardedSgd", "Sgd"):
        view |= {"optimizer": "sgd", "optimizer.momentum": o["momentum"] or 0.0, "optimizer.nesterov": o["nesterov"]}
    elif cls == "Lion":
        view |= {"optimizer": "lion", "optimizer.b1": o["beta1"], "optimizer.b2": o["beta2"],
                 "clip_update_rms": max(o["clip_threshold"], 0.0)}  # fmt: skip
        weight_decay = o["weight_decay"] or 0.0
    else:
        view["optimizer"] = none_for(f"Praxis optimizer {cls}")
    l2 = o["l2_regularizer_weight"] or 0.0
    mask = "matrices"
    if weight_decay > 0:
        mask = "all"
    elif l2 > 0 and not o["skip_lp_1d_vectors"]:
        mask = "all"
    view |= {"learning_rate": o["learning_rate"], "weight_decay": weight_decay, "weight_decay_mask": mask,
             "l2_regularization": l2, "clip_grad_norm": o["clip_gradient_norm_to_value"],
             "ema_decay": o["ema_decay"], "skip_nonfinite": bool(learner["check_valid_step"])}  # fmt: skip
    for name in ("clip_gradient_single_norm_to_value", "l1_regularizer_weight", "decoupled_weight_decay",
                 "ewc_regularizer_weight"):  # fmt: skip
        if o.get(name):
            view[name] = none_for(f"Praxis {name} {o[name]}")
    if learner["check_valid_step"] and learner.get("skip_step_gradient_norm_value"):
        view["skip_step_gradient_norm_value"] = none_for(
            f"Paxml Learner.skip_step_gradient_norm_value {learner['skip_step_gradient_norm_value']}"
        )
    return view


def schedule_view(schedule: dict[str, Any] | None) -> dict[str, Any]:
    """Praxis' lr_schedule as pax_eqx's ScheduleConfig fields (pax_eqx/learners/schedules.py).

    LinearRampupExponentialDecay / LinearRampupCosineDecay: exponential / cosine, field for
    field. Constant(value): constant, max = value. LinearRampupPiecewiseConstant(boundaries
    [w, b...], values [v, u...]): piecewise, warmup_steps w, max v, boundaries [b...], values
    [u / v...]. LinearRampupSqrtDecay(peak, warmup_steps): rsqrt. None (no schedule): constant 1.
    """
    if schedule is None:
        return {"schedule": "constant", "schedule.warmup_steps": 0, "schedule.max": 1.0}
    cls, s = schedule["class"], schedule
    decaying = {"LinearRampupExponentialDecay": "exponential", "LinearRampupCosineDecay": "cosine"}
    if cls in decaying:
        return {"schedule": decaying[cls], **{f"schedule.{k}": s[k] for k in
                ("warmup_steps", "decay_start", "decay_end", "min_ratio", "max")}}  # fmt: skip
    if cls == "Constant":
        return {"schedule": "constant", "schedule.warmup_steps": 0, "schedule.max": s["value"]}
    if cls == "LinearRampupPiecewiseConstant":
        (w, *bounds), (v, *values) = s["boundaries"], s["values"]
        return {"schedule": "piecewise", "schedule.warmup_steps": w, "schedule.max": v,
                "schedule.boundaries": tuple(bounds), "schedule.values": tuple(u / v for u in values)}  # fmt: skip
    if cls == "LinearRampupSqrtDecay":
        return {"schedule": "rsqrt", "schedule.warmup_steps": s["warmup_steps"], "schedule.max": s["peak"]}
    return {"schedule": none_for(f"Praxis schedule {cls}")}


# What Paxml says, and what pax_eqx has, under pax_eqx's field names ------------------------------
_NETWORKS = {"ResNet": "ResNetConfig", "CNN": "CNNConfig"}
_MODELS = {"LanguageModel": "LanguageModelConfig", "BertModel": "BertModelConfig"}


def expected(entry: dict[str, Any], exp: ExperimentConfig) -> dict[str, Any]:
    """Paxml's values, keyed by the pax_eqx field (as `ExperimentConfig` spells it) that must hold them."""
    m, train, learner = entry["model"], entry["train"], entry["learner"]
    want: dict[str, Any] = {
        "data.train.batch_size": global_batch(entry, exp, 0),
        "data.eval.batch_size": global_batch(entry, exp, 1),
        **mesh_view(entry["mesh"], exp),
        "train.fprop_dtype": fprop_dtype(entry),
        "train.num_steps": train["num_train_steps"],
        "train.summary_interval_steps": train["summary_interval_steps"],
        "train.eval_interval_steps": train["eval_interval_steps"],
        "checkpoint.every_n_steps": train["save_interval_steps"],
        "checkpoint.max_to_keep": train["save_max_to_keep"],
    }
    want |= {f"learner.{k}": v for k, v in learner_view(learner["optimizer"], learner).items()}
    want |= {f"learner.{k}": v for k, v in schedule_view(learner["lr_schedule"]).items()}
    if m["family"] == "lm":
        pipelined = bool(m["num_stages"])
        micro = m["num_microbatches"] or (want["data.train.batch_size"] // m["microbatch_size"] if pipelined else 1)
        want |= {
            "model": _MODELS.get(entry["model_class"], none_for(f"Praxis model {entry['model_class']}")),
            "model.num_layers": m["num_layers"],
            "model.model_dims": m["model_dims"],
            "model.hidden_dims": m["hidden_dims"],
            "model.num_heads": m["num_heads"],
            "model.head_dim": m["dims_per_head"] or m["model_dims"] // m["num_heads"],
            "model.num_kv_heads (effective)": m["layer"]["num_kv_heads"] or m["num_heads"],
            "model.vocab_size": m["vocab_size"],
            "data.seq_len": entry["data"]["inputs"][0]["seq_len"],
            "model.repeat": m["use_repeated_layer"] or pipelined,
            "model.remat_policy": remat_policy(m),
            "model.pipeline.num_stages": m["num_stages"] or 1,
            "model.pipeline.num_microbatches": micro,
            "model.pipeline.circular_repeat": m["circular_repeat"] or 1,
            "model.moe_layer_interval": moe_layer_interval(m),
        }
        if m["num_experts"]:
            want |= {
                "model.moe.num_experts": m["num_experts"],
                "model.moe.num_groups": m["num_groups"],
                "model.moe.capacity_factor": m["capacity_factor"],
                "model.moe.top_k": 2 if m["gating_func"] == "top2" else none_for(f"gating {m['gating_func']}"),
                "model.moe.load_balance_loss_weight": m["moe_load_balance_loss_weight"],
                "model.moe_hidden_dims (effective)": m["moe_hidden_dims"] or m["hidden_dims"],
            }
    elif m["family"] == "vision":
        want |= {
            "model": "ClassificationModelConfig",
            "model.network": _NETWORKS.get(m["network"], none_for(f"Praxis network {m['network']}")),
            "model.num_classes": m["num_classes"],
            "model.input_shape[:2]": (m["image_height"], m["image_width"]),
        }
        if m["network"] == "ResNet":
            want |= {
                "model.network.blocks": tuple(m["resnet_blocks"]),
                "model.network.channels": tuple(m["resnet_channels"]),
                "model.network.block.zero_init_residual": m["zero_init_residual"],
            }
        if m["network"] == "CNN":
            want["model.network.kernel_size"] = m["kernel_size"]
    else:  # ClassificationMLPModel: ids -> tied embedding -> MLPBlock -> softmax over the ids
        dims = m["mlp_input_dims"]
        tied = m["mlp_output_dims"] == dims == m["num_classes"]
        want |= {
            "model": "TokenMlpConfig",
            "model.num_layers": m["mlp_num_layers"],
            "model.hidden_dims": m["mlp_hidden_dims"],
            "model.input_dims": dims if tied else none_for("an MLPBlock whose output_dims or classes != input_dims"),
            "data.seq_len": entry["data"]["inputs"][0]["seq_len"],
        }
    return want


_MISSING = NoCounterpart("<no such pax_eqx field>")


def actual(exp: ExperimentConfig, key: str) -> Any:
    """pax_eqx's value of `key` (an `expected` key), or _MISSING when exp has no such field."""
    ln = exp.learner
    special = {
        "model": lambda: type(exp.model).__name__,
        "model.network": lambda: type(exp.model.network).__name__,
        "model.input_shape[:2]": lambda: tuple(exp.model.input_shape[:2]),
        "learner.optimizer": lambda: "adam" if ln.optimizer.kind in ("adam", "adamw") else ln.optimizer.kind,
        "learner.schedule": lambda: ln.schedule.kind,
        "model.moe_hidden_dims (effective)": lambda: exp.model.moe_hidden_dims or exp.model.hidden_dims,
        "model.num_kv_heads (effective)": lambda: exp.model.num_kv_heads or exp.model.num_heads,
    }
    try:
        if key in special:
            return special[key]()
        value: Any = exp
        for part in key.split("."):
            value = getattr(value, part)
    except AttributeError:
        return _MISSING
    return tuple(value) if isinstance(value, list) else value


def same(want: Any, got: Any) -> bool:
    if isinstance(want, NoCounterpart) or isinstance(got, NoCounterpart):
        return False
    if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(want, bool):
        return math.isclose(want, got, rel_tol=1e-9, abs_tol=0.0) or want == got
    if isinstance(want, tuple) and isinstance(got, tuple) and len(want) == len(got):
        return all(same(w, g) for w, g in zip(want, got))
    return want == got


def differences(entry: dict[str, Any], exp: ExperimentConfig) -> list[str]:
    """'field: pax_eqx X != Paxml Y' for every field that differs, in `expected`'s order."""
    out = []
    for key, want in expected(entry, exp).items():
        got = actual(exp, key)
        if not same(want, got):
            out.append(f"{key}: pax_eqx {got!s} != Paxml {want!s}")
    return out


def test_the_table_is_paxml_1_4s_90_experiments():
    assert SOURCE == {"paxml": "1.4.0", "praxis": "1.4.0", "generated_by": "generate_paxml_table.py", "count": 90}
    assert len(TABLE) == 90 and all(entry["error"] is None for entry in TABLE.values())


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_pax_eqx_has_paxmls_experiment(name: str):
    entry = TABLE[name]
    module = entry["module"].removeprefix("paxml.")
    try:
        exp = registry.load_experiment(name)
    except registry.UnknownExperimentError:
        pytest.fail(f"{name}: not registered in pax_eqx (no experiment has the alias {name!r}, Paxml's {module})",
                    pytrace=False)  # fmt: skip
    except Exception as e:  # an experiment that raises while loading
        pytest.fail(f"{name}: load_experiment raised {type(e).__name__}: {str(e).splitlines()[0]}", pytrace=False)
    diffs = differences(entry, exp)
    if diffs:
        pytest.fail(f"{name} ({exp.name}): {len(diffs)} fields differ from Paxml's: " + "; ".join(diffs), pytrace=False)
