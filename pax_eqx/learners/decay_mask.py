"""Which parameters get weight decay: matrices yes, norms and biases no.

The rule: a parameter is decayed iff it has at least 2 dimensions *per layer*. Norm scales,
biases and other vectors (1-D per layer) are not decayed; weight matrices, embeddings and
convolution kernels are.

"Per layer" matters because a stack of layers built with `filter_vmap` (scan over layers,
`pax_eqx.layers.scanned_stack.StackedTransformerRepeated`) gives every array a leading `layers`
axis: a stacked LayerNorm scale is [layers, dims], 2-D, yet must not be decayed. Such a stack
says so with a class attribute `stacked_field = "<field name>"` (the same convention the
logical-axis walker in `pax_eqx.sharding.logical` uses); every array below that field has one
leading stacked axis per stack it sits in, and those axes are not counted.

For a pytree without that marker (plain dicts, your own vmap-built stack), pass
`stacked_leading_axes=n` to discount `n` leading axes on every array, or give
`build_optimizer` your own `decay_mask`.
"""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu


def default_decay_mask(params: Any, stacked_leading_axes: int | None = None) -> Any:
    """A pytree like `params` with a bool per array: True = apply weight decay.

    params: the parameters (or gradients/updates of the same structure; arrays or
      ShapeDtypeStructs: only `.ndim` is read).
    stacked_leading_axes: None = count the stacked axes of each array from the `stacked_field`
      markers of the equinox modules above it; an int = that many on every array.
    """
    leaves, treedef = jtu.tree_flatten_with_path(params)
    mask = []
    for path, leaf in leaves:
        stacked = _stacked_axes(params, path) if stacked_leading_axes is None else stacked_leading_axes
        mask.append(getattr(leaf, "ndim", 0) - stacked >= 2)
    return jtu.tree_unflatten(treedef, mask)


def _stacked_axes(root: Any, path: tuple) -> int:
    """How many modules on the way from `root` to the leaf at `path` stack the field taken."""
    node, stacked = root, 0
    for entry in path:
        if isinstance(entry, jtu.GetAttrKey):
            if getattr(node, "stacked_field", None) == entry.name:
                stacked += 1
            node = getattr(node, entry.name)
        elif isinstance(entry, jtu.SequenceKey):
            node = node[entry.idx]
        elif isinstance(entry, jtu.DictKey):
            node = node[entry.key]
        else:  # a custom pytree node: no markers can be read below it
            break
    return stacked
