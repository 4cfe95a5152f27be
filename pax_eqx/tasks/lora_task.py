"""LoraTask: the Task of a LoRA run (`ExperimentConfig.lora`): the base frozen, the adapters trained.

Its parameters are `LoraParams(base, adapters)` (`lora_adapters.py`). The Task's own machinery
does the rest, through its two masks: the base is neither differentiated nor optimised, so it
gets no gradient, no optimizer state (its places in the optimizer state are None: nothing is
allocated, not even zeros) and no EMA, and it keeps its bits; the adapters are the whole of
what the optimizer sees. The model is built from the base with each chosen weight merged,
W + (alpha / rank) A @ B, so every program (train, eval, decode, export) computes with the
adapted model and needs nothing new.

With `lora.dropout` > 0 the training forward differs (`model(params, key, Mode.TRAIN)`): each
chosen weight that a layer multiplies by (a Linear's w, an Attention's w_q, w_k, w_v, w_o) is a
`LowRankAdapted` that drops out its input with a mask drawn from the step's key; an embedding
table or softmax weight (a [vocab, embed] lookup, PEFT's Embedding, which has no dropout, or the
softmax's, which the chunked cross-entropy reads transposed) stays merged. Any other chosen
weight is refused when the Task is built (no layer would apply the adapter to its input).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
from jaxtyping import PRNGKeyArray

from pax_eqx.config import ConfigError
from pax_eqx.layers.attentions import Attention
from pax_eqx.layers.base import DEFAULT_SUMMARY_VERBOSITY, Mode, split_state
from pax_eqx.layers.embedding_softmax import Embedding, FullSoftmax, SharedEmbeddingSoftmax
from pax_eqx.layers.fp8 import overwritten_mask
from pax_eqx.layers.linears import Linear
from pax_eqx.layers.low_rank import LowRankAdapted
from pax_eqx.learners import LearnerConfig, build_optimizer
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.learners.variables import path_name
from pax_eqx.models.model import Model, ModelConfig
from pax_eqx.task_config import TaskConfig
from pax_eqx.tasks.lora_adapters import LoraParams, Target, init_adapters, merge, plan_targets, with_dropout
from pax_eqx.tasks.task import Task, is_param


class LoraTask(Task):
    """A Task whose parameters are LoraParams; `lora` chooses the weights, rank and scale."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        learner_cfg: LearnerConfig,
        lora: LoraConfig,
        task_cfg: TaskConfig = TaskConfig(),
        fprop_dtype: str = "float32",
        summary_verbosity: int = DEFAULT_SUMMARY_VERBOSITY,
        per_example: bool = False,
    ):
        if learner_cfg.frozen:
            raise ConfigError(
                f"learner.frozen={learner_cfg.frozen!r} with lora.targets: under LoRA every base weight is frozen "
                "already and only the adapters train; drop --learner.frozen (or adapt fewer weights with lora.targets)."
            )
        super().__init__(model_cfg, learner_cfg, task_cfg, fprop_dtype, summary_verbosity, per_example)
        self.lora = lora
        model, _ = jax.eval_shape(lambda: split_state(model_cfg.build(jax.random.PRNGKey(0))))
        base = eqx.filter(model, is_param)
        if overwritten_mask(base) is not None:
            raise ConfigError(
                "lora.targets with an fp8 model (model...fp8=True): its scales are updated every step, which a frozen "
                "base cannot be; turn fp8 off for a LoRA run."
            )
        self.targets = plan_targets(lora, base)
        self.merged_in_training = (
            _merged_under_dropout(model, self.targets, lora.dropout) if lora.dropout > 0 else frozenset()
        )
        abstract = LoraParams(
            base, jax.eval_shape(lambda: init_adapters(self.targets, lora.rank, jax.random.PRNGKey(0)))
        )
        trainable = LoraParams(jax.tree.map(lambda _: False, base), jax.tree.map(lambda _: True, abstract.adapters))
        self.optimized_mask = self.differentiated_mask = trainable
        optimized, _ = self.split_optimized(abstract)
        self.optimizer = build_optimizer(learner_cfg, optimized)

    def initial_params(self, model: Model, key: PRNGKeyArray) -> LoraParams:
        """The base as the model's initialisation (the run replaces it with the base checkpoint's)
        and adapters from their own key; `Task.init_state` adds the adapters' optimizer state and
        EMA (they are the optimised part)."""
        adapters = init_adapters(self.targets, self.lora.rank, jax.random.fold_in(key, 1))
        return LoraParams(eqx.filter(model, eqx.is_array), adapters)

    def model(self, params: Any, key: PRNGKeyArray | None = None, mode: Mode = Mode.EVAL) -> Model:
        """The model with every adapted weight merged: W + (alpha / rank) A @ B; in a training
        forward with lora.dropout > 0, with the multiplied ones LowRankAdapted (the module doc)."""
        if mode is not Mode.TRAIN or self.lora.dropout == 0:
            return eqx.combine(merge(params, self.targets, self.lora.scale), self.static)
        if key is None:
            raise ValueError("LoraTask.model: a training forward with lora.dropout > 0 draws masks; pass its key")
        key = jax.random.fold_in(key, _DROPOUT_STREAM)  # apart from the layers' own dropout
        weights = with_dropout(params, self.targets, self.lora.scale, self.lora.dropout, key, self.merged_in_training)
        return eqx.combine(weights, self.static, is_leaf=lambda x: isinstance(x, LowRankAdapted))

    def merged_params(self, params: LoraParams) -> Any:
        """The model's own params pytree with the adapters merged in (what export_hf writes)."""
        return merge(params, self.targets, self.lora.scale)


_DROPOUT_STREAM = 0x4C6F5241  # "LoRA": folded into the forward's key for the adapters' masks

_MULTIPLIED = {Linear: ("w",), Attention: ("w_q", "w_k", "w_v", "w_o")}
"""The weights a layer multiplies through `linears.dense`, where a LowRankAdapted applies."""

_MERGED = (Embedding, SharedEmbeddingSoftmax, FullSoftmax)
"""Layers whose weights stay merged under dropout: looked up (PEFT's Embedding has no dropout) or
read transposed by the chunked cross-entropy."""


def _merged_under_dropout(model: Any, targets: dict[str, Target], dropout: float) -> frozenset[str]:
    """The targets that stay merged in a training forward with dropout (`_MERGED` layers' weights);
    a ConfigError for a target no layer multiplies through `dense` (e.g. an MoE expert's weights)."""
    merged = set()
    for path, _ in jtu.tree_flatten_with_path(eqx.filter(model, is_param))[0]:
        name = path_name(path)
        if name not in targets:
            continue
        owner = model
        for entry in path[:-1]:
            owner = _child(owner, entry)
        field = path[-1].name if isinstance(path[-1], jtu.GetAttrKey) else None
        if isinstance(owner, _MERGED):
            merged.add(name)
        elif not any(isinstance(owner, kind) and field in fields for kind, fields in _MULTIPLIED.items()):
            raise ConfigError(
                f"lora.dropout={dropout} with lora.targets choosing {name} (a {type(owner).__name__}'s {field}): "
                "dropout on an adapter's input applies to the weights a layer multiplies its input by (a Linear's w, "
                f"attention's w_q, w_k, w_v, w_o) and embeddings; drop {name} from lora.targets or pass "
                "--lora.dropout 0."
            )
    return frozenset(merged)


def _child(node: Any, entry: Any) -> Any:
    """node's child at one key-path entry (a module field, a list or tuple item, a dict value)."""
    if isinstance(entry, jtu.GetAttrKey):
        return getattr(node, entry.name)
    if isinstance(entry, jtu.SequenceKey):
        return node[entry.idx]
    return node[entry.key]
