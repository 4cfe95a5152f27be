"""Rematerialisation policies: which activations a layer keeps for the backward pass.

`RematPolicy` names what a stack's `remat_policy` may be: "none" (no rematerialisation, every
activation kept) or a `jax.checkpoint_policies` policy, plain (`dots_saveable`, ...) or one
keyed to the activation names the attention layer tags with `checkpoint_name` ("query_proj",
"key_proj", "value_proj", "combined_qkv_proj", "context", "out_proj", as Praxis'
checkpoint_policy.py). `remat(fn, policy)` wraps a function (a scanned stack's body, a pipeline
stage) in `jax.checkpoint` with it; the list stack applies the same policies per layer with
`eqx.filter_checkpoint`. Everything a policy does not save is recomputed in the backward pass.
"""

from __future__ import annotations

import typing
from typing import Literal

import jax

RematPolicy = Literal[
    "none",
    "full",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "dots_with_no_batch_dims_and_context",
    "save_context_and_out_proj",
    "save_qkv_context_and_out_proj",
    "everything_saveable",
]

_cp = jax.checkpoint_policies
# What each layer keeps for the backward pass; everything else is recomputed. The named ones
# use the activation names the attention layer tags (Praxis' checkpoint_policy.py):
#   save_context_and_out_proj     = Pax SAVE_CONTEXT_AND_OUT_PROJ
#   save_qkv_context_and_out_proj = Pax SAVE_DOT_FOR_MLPERF_200B
#   dots_with_no_batch_dims_and_context: every weight matmul plus the attention output, and,
#     for cuDNN's fused attention, everything its forward kernel returns (the output and the
#     softmax statistics its backward kernel reads), so that kernel never runs again in the
#     backward. Saving the named output alone is not enough: the statistics are a residual
#     of jax's custom VJP, not a named activation, and rebuilding them re-ran the kernel.


def _fused_attention_forward(prim, *_, **__) -> bool:
    """Save the outputs of jax's cuDNN attention forward primitive (output + statistics)."""
    return prim.name in ("dot_product_attention_fwd_wrapper", "dot_product_attention_fp8_fwd_wrapper")


REMAT_POLICIES: dict[str, typing.Callable[..., bool]] = {
    "full": _cp.nothing_saveable,
    "dots_saveable": _cp.dots_saveable,
    "dots_with_no_batch_dims_saveable": _cp.dots_with_no_batch_dims_saveable,
    "dots_with_no_batch_dims_and_context": _cp.save_from_both_policies(
        _cp.save_from_both_policies(_cp.dots_with_no_batch_dims_saveable, _cp.save_only_these_names("context")),
        _fused_attention_forward,
    ),
    "save_context_and_out_proj": _cp.save_only_these_names("context", "out_proj"),
    "save_qkv_context_and_out_proj": _cp.save_only_these_names(
        "combined_qkv_proj", "query_proj", "key_proj", "value_proj", "context", "out_proj"
    ),
    "everything_saveable": _cp.everything_saveable,
}


def remat(fn: typing.Callable, policy: str, prevent_cse: bool = True) -> typing.Callable:
    """`fn` rematerialised under the named policy (`fn` itself for "none"). prevent_cse: jax's
    CSE barriers, which a rolled scan does not need (see StackedTransformerRepeated)."""
    return fn if policy == "none" else jax.checkpoint(fn, policy=REMAT_POLICIES[policy], prevent_cse=prevent_cse)
