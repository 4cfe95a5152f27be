"""`python -m pax_eqx.quantize --job-log-dir DIR --out OUT --bits 8|4`: post-training quantization.

Writes OUT, a job dir whose checkpoint holds DIR's weights as integers and per-channel scales
(int8, or int4 packed two a byte) and whose config.json records how (`quantization` int), so
that `python -m pax_eqx.eval --job-log-dir OUT`, `decode` and `serve` run the model on the
integers (pax_eqx/programs/materialize.py; docs/quantize.md).

    --bits 8|4             the weights' grid (default: a quantization-aware job's own weight_bits)
    --activation-bits 0|8  quantize the inputs of the quantized products on the fly (int8 x int8
                           in int32); 0 = float activations (default)
    --layers dense ...     which layers (dense attention embedding softmax conv); default: every one
    --step N               the checkpoint (default: the newest)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pax_eqx.command_line import entry
from pax_eqx.number_flags import number

DESCRIPTION = (
    "Quantize a job dir's weights to int8 or int4 (per-channel scales) into a new job dir that eval, decode and serve "
    "run in int."
)
LAYERS = ("dense", "attention", "embedding", "softmax", "conv")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = entry.OneLineParser(prog="python -m pax_eqx.quantize", description=DESCRIPTION)
    parser.add_argument("--job-log-dir", "--job_log_dir", dest="job_log_dir", required=True, metavar="DIR")
    parser.add_argument("--out", required=True, metavar="OUT", help="the job dir to write (new or empty)")
    parser.add_argument(
        "--bits", type=int, choices=(8, 4), default=None,
        help="the weights' bits: 8 (int8) or 4 (int4, two a byte); default: a quantization-aware job's own",
    )  # fmt: skip
    parser.add_argument(
        "--activation-bits", type=int, choices=(0, 8), default=0,
        help="8: the quantized products' inputs in int8 too (int32 accumulation); 0: float (default)",
    )  # fmt: skip
    parser.add_argument("--layers", nargs="+", choices=LAYERS, default=(), help="which layers (default: every one)")
    parser.add_argument("--step", type=number(int, ge=0), default=None, help="the checkpoint step (default: newest)")
    ns = parser.parse_args(argv)
    from pax_eqx.programs.materialize import materialize

    materialize(
        ns.job_log_dir, ns.out, ns.bits, activation_bits=ns.activation_bits, layers=tuple(ns.layers), step=ns.step
    )
    return 0


if __name__ == "__main__":
    entry.run(main)
