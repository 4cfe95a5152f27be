"""One evaluation run, following Pax's reset_for_eval x eval_loop_num_batches table.

reset_for_eval=True: the eval input is reset and read to StopIteration (one epoch; every host
stops after the same number of batches, padded rows carrying zero weight). Otherwise the next
`eval_loop_num_batches` batches of a repeating input are read, so successive runs roll over
non-overlapping data. Metrics are averaged weighted by each batch's number of predictions,
so padding never counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from pax_eqx.data import eval_num_batches
from pax_eqx.programs.errors import DataPipelineError, raised_at


def evaluate(rt: Any, state: Any, log: Callable = print) -> dict[str, float]:
    cfg = rt.exp.data.eval
    source = rt.input("eval")
    num_batches = eval_num_batches(cfg)
    if cfg.reset_for_eval:
        source.reset()
    totals: dict[str, float] = {}
    weight = 0.0
    count = 0
    while num_batches is None or count < num_batches:
        try:
            local = source.get_next()
        except StopIteration:
            break
        except Exception as e:
            raise DataPipelineError(
                f"the eval input failed while reading eval batch {count + 1}: {type(e).__name__}: {e}"
                f"{raised_at(e)}. Fix data.eval (or its files) and rerun the same command (set "
                "PAX_EQX_TRACEBACK=1 for the full traceback)"
            ) from e
        metrics = jax.device_get(rt.programs.eval_step(state, rt.programs.global_batch(local)))
        n = float(metrics["num_predictions"])
        for k, v in metrics.items():
            if k != "num_predictions":
                totals[k] = totals.get(k, 0.0) + float(v) * n
        weight += n
        count += 1
    if count == 0:
        raise ValueError("the eval input produced no batches; check data.eval (path, split, batch_size).")
    result = {k: v / max(weight, 1.0) for k, v in totals.items()}
    result["num_predictions"] = weight
    result["num_batches"] = float(count)
    result["pplx"] = float(np.exp(min(result["log_pplx"], 50.0)))
    log(f"eval: loss {result['total_loss']:.4f}, accuracy {result['accuracy']:.4f} over {count} batches")
    return result
