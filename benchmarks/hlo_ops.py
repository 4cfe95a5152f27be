"""What each instruction of a compiled XLA module is: its kind, its matmul FLOPs, how often it runs.

A profiler trace names the instruction behind every kernel (`hlo_op`) but says nothing of what
it computes. This reads the optimized HLO text (`jax.stages.Compiled.as_text()`) into one
`Op` per instruction that runs as a kernel of its own, so a trace can be summed by kind and
each matmul's achieved TFLOP/s computed:

    ops = index_module(compiled.as_text())
    ops["gemm_fusion_dot.3"]  # Op(category="matmul", flops=2.1e11, executions=24, ...)

- category: "matmul" (a dot, a cuBLAS custom call, or a fusion with a dot inside: Triton
  GEMMs, cuDNN GEMM fusions, XLA:CPU's library fusions), "convolution" (a `convolution`, a
  fusion holding one, or a cuDNN convolution custom call), "attention" (cuDNN's fused
  attention), "collective", "copy/transpose", "reduction fusion" (kInput), "elementwise
  fusion" (kLoop / kOutput), "other", or CONTROL_FLOW (a while loop, conditional or call: its
  trace events enclose its contents' and must not be added to them).
- flops: 2 x (output elements) x (contracted size), summed over the dots of a fusion; for a
  convolution 2 x (output elements) x (window taps on real input elements, averaged over the
  output positions) x (input features per group): taps that fall on the zero padding or on the
  holes of a dilated input (`lhs_dilate`, the input gradient of a strided convolution) are not
  multiply-adds of the data and are not counted, as in XLA's own cost analysis. 0 for
  everything else (attention's FLOPs depend on masking the HLO does not show).
- executions: runs per call of the module; an instruction inside a while loop's body runs
  its `known_trip_count` times (a `lax.scan` over layers: once per layer). A loop XLA gives no
  trip count counts once (`Op.counted` is False inside it); every branch of a conditional
  counts as run (an upper bound).
- "reduction fusion" is XLA's kInput fusion kind: reductions, and on GPU also scatters and
  some transposes; XLA:CPU labels its reductions kLoop ("elementwise fusion").

Computations that are fused into an instruction (`calls=`) or that are reducers (`to_apply=`
of a reduce) are not scheduled themselves; the instructions of the entry computation, of
while bodies and conditions, of conditional branches and of `call`ed computations are.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

CONTROL_FLOW = "control flow"  # while / conditional / call: a trace's event for one spans its contents
_CONTAINERS = ("while", "conditional", "call")
# Instructions that launch no kernel of their own.
_NO_KERNEL = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "add-dependency",
    "async-start", "async-update", "async-done", "opt-barrier", "partition-id", "replica-id",
}  # fmt: skip
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "send", "recv")
_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.*)$")
_ARRAY = re.compile(r"\w+\[([\d,]*)\]")


@dataclasses.dataclass
class Op:
    name: str
    opcode: str
    category: str
    flops: float  # per execution
    executions: int  # per call of the module
    shape: str  # the output type as HLO prints it
    source: str  # jax's op_name metadata: which line of the model it came from
    counted: bool = True  # False: inside a loop of unknown trip count, which counts as one


@dataclasses.dataclass
class _Instr:
    name: str
    computation: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str


def _split_shape(rest: str) -> tuple[str, str]:
    """'(f32[2], s8[4]) custom-call(...)' -> ('(f32[2], s8[4])', 'custom-call(...)')."""
    if not rest.startswith("("):
        shape, _, tail = rest.partition(" ")
        return shape, tail
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[: i + 1], rest[i + 1 :].lstrip()
    return rest, ""


def _split_call(tail: str) -> tuple[str, str, str]:
    """'dot(%a, %b), lhs_contracting_dims={1}' -> ('dot', '%a, %b', 'lhs_contracting_dims={1}')."""
    opcode, _, after = tail.partition("(")
    depth = 1
    for i, ch in enumerate(after):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return opcode.strip(), after[:i], after[i + 1 :]
    return opcode.strip(), after, ""


def _operand_names(operands: str) -> list[str]:
    """'bf16[8,64]{1,0} %a, %b' or 'a, b' -> ['a', 'b']: the last word of each top-level item."""
    names, depth, item = [], 0, ""
    for ch in operands + ",":
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            if item.strip():
                names.append(item.split()[-1].lstrip("%"))
            item = ""
        else:
            item += ch
    return names


def dims(shape: str) -> list[int]:
    """The dimensions of an array type, or of a tuple's first element: 'bf16[8,64]{1,0}' -> [8, 64]."""
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _int_list(attrs: str, key: str) -> list[int]:
    m = re.search(key + r"=\{([\d,]*)\}", attrs)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _backend_config(attrs: str) -> dict:
    start = attrs.find("backend_config=")
    if start < 0:
        return {}
    text = attrs[start + len("backend_config=") :]
    try:
        value = json.JSONDecoder().raw_decode(text)[0]
        if isinstance(value, str):  # older XLA quotes it: backend_config="{\"n\":...}"
            value = json.loads(value)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_module(hlo_text: str) -> tuple[dict[str, _Instr], dict[str, list[str]], str]:
    """(instructions by name, instruction names by computation, entry computation name)."""
    instrs: dict[str, _Instr] = {}
    computations: dict[str, list[str]] = {}
    entry, current = "", ""
    for line in hlo_text.splitlines():
        if (m := _COMPUTATION.match(line)) and not line.startswith(" "):
            current = m.group(2)
            computations[current] = []
            entry = current if m.group(1) else entry
            continue
        m = _INSTRUCTION.match(line)
        if not m or not current:
            continue
        shape, tail = _split_shape(m.group(2))
        opcode, operands, attrs = _split_call(tail)
        instrs[m.group(1)] = _Instr(m.group(1), current, shape, opcode, _operand_names(operands), attrs)
        computations[current].append(m.group(1))
    return instrs, computations, entry


def _matmul_flops(instr: _Instr, instrs: dict[str, _Instr]) -> float:
    """2 x (output elements) x (contracted size) of a `dot`, or of a cuBLAS custom call, whose
    dimension numbers live in its backend config; 0 when the left operand is not in the module."""
    lhs = instrs.get(instr.operands[0]) if instr.operands else None
    if lhs is None:
        return 0.0
    if instr.opcode == "dot":
        contracting = _int_list(instr.attrs, "lhs_contracting_dims")
    else:
        numbers = _backend_config(instr.attrs).get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
        if not numbers:
            return 0.0
        contracting = [int(d) for d in numbers.get("lhs_contracting_dimensions", [])]
    lhs_dims = dims(lhs.shape)
    return 2.0 * math.prod(dims(instr.shape)) * math.prod(lhs_dims[d] for d in contracting)


def _window(attrs: str) -> dict[str, list]:
    """`window={size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=1x2 rhs_dilate=2x2}` -> lists per spatial dim."""
    m = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(item.split("=", 1) for item in m.group(1).split()) if m else {}
    out: dict[str, list] = {}
    for key in ("size", "stride", "lhs_dilate", "rhs_dilate"):
        if key in fields:
            out[key] = [int(v) for v in fields[key].split("x")]
    if "pad" in fields:
        out["pad"] = [
            tuple(int(v) for v in re.fullmatch(r"(-?\d+)_(-?\d+)", p).groups()) for p in fields["pad"].split("x")
        ]
    return out


def _valid_taps(size: int, out: int, window: int, stride: int, pad_lo: int, lhs_dilate: int, rhs_dilate: int) -> int:
    """(output position, window tap) pairs of one spatial dimension that land on a real element of
    the input: not on padding, not on a hole of the dilated input."""
    last = (size - 1) * lhs_dilate  # the dilated input spans positions 0..last
    taps = 0
    for o in range(out):
        for k in range(window):
            p = o * stride + k * rhs_dilate - pad_lo
            taps += 0 <= p <= last and p % lhs_dilate == 0
    return taps


def conv_flops(lhs_shape: str, rhs_shape: str, out_shape: str, attrs: str) -> float:
    """Multiply-add FLOPs (x2) of a convolution whose operands and result have these HLO types and
    whose `window=` / `dim_labels=` are in `attrs`: 2 x batch x output features x (valid taps,
    the product over spatial dims of `_valid_taps`) x input features per group (the kernel's `i`)."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs)
    if labels is None:
        return 0.0
    lhs_l, rhs_l, out_l = labels.groups()
    lhs, rhs, out = dims(lhs_shape), dims(rhs_shape), dims(out_shape)
    if not (len(lhs) == len(lhs_l) and len(rhs) == len(rhs_l) and len(out) == len(out_l)):
        return 0.0
    spatial = sorted(c for c in out_l if c.isdigit())
    window = _window(attrs)
    n = len(spatial)
    taps = 1
    for i, d in enumerate(spatial):
        taps *= _valid_taps(
            size=lhs[lhs_l.index(d)],
            out=out[out_l.index(d)],
            window=window.get("size", [rhs[rhs_l.index(d)]] * n)[i],
            stride=window.get("stride", [1] * n)[i],
            pad_lo=window.get("pad", [(0, 0)] * n)[i][0],
            lhs_dilate=window.get("lhs_dilate", [1] * n)[i],
            rhs_dilate=window.get("rhs_dilate", [1] * n)[i],
        )
    return 2.0 * out[out_l.index("b")] * out[out_l.index("f")] * taps * rhs[rhs_l.index("i")]


# cuDNN's convolutions on GPU: (target, which of (operands..., result) are the forward
# convolution's input, kernel and output). The attributes describe the forward convolution.
_CUDNN_CONVS = {
    "__cudnn$convForward": (0, 1, -1),
    "__cudnn$convBiasActivationForward": (0, 1, -1),
    "__cudnn$convBackwardInput": (-1, 1, 0),
    "__cudnn$convBackwardFilter": (0, -1, 1),
}


def _convolution_flops(instr: _Instr, instrs: dict[str, _Instr]) -> float:
    """FLOPs of a `convolution` or a cuDNN convolution custom call; 0 when an operand is unknown."""
    shapes = [instrs[o].shape if o in instrs else "" for o in instr.operands]
    if instr.opcode == "convolution":
        roles = (0, 1, -1)
    else:
        target = re.search(r'custom_call_target="([^"]*)"', instr.attrs)
        roles = _CUDNN_CONVS.get(target.group(1) if target else "")
        if roles is None:
            return 0.0
    shapes.append(instr.shape)  # a custom call's result is a tuple: `dims` reads its first element
    if len(shapes) < 3 or not all(shapes[r] for r in roles):
        return 0.0
    return conv_flops(*(shapes[r] for r in roles), instr.attrs)


def _is_convolution(instr: _Instr, instrs, computations) -> bool:
    if instr.opcode == "convolution" or "__cudnn$conv" in instr.attrs:
        return True
    if instr.opcode == "fusion":
        return any(
            _is_convolution(instrs[n], instrs, computations)
            for c in _called(instr.attrs, "calls")
            for n in computations.get(c, [])
        )
    return False


def _called(attrs: str, key: str) -> list[str]:
    """Computations an attribute names: `calls=%f`, `body=%b`, `branch_computations={%t, %f}`."""
    m = re.search(key + r"=(\{[^}]*\}|%?[\w.\-]+)", attrs)
    return re.findall(r"%?([\w.\-]+)", m.group(1).strip("{}")) if m else []


def _fused_flops(computation: str, instrs, computations) -> float:
    """Matmul and convolution FLOPs of a fused computation, nested fusions included."""
    total = 0.0
    for name in computations.get(computation, []):
        instr = instrs[name]
        if instr.opcode == "dot":
            total += _matmul_flops(instr, instrs)
        elif instr.opcode == "convolution":
            total += _convolution_flops(instr, instrs)
        elif instr.opcode == "fusion":
            total += sum(_fused_flops(c, instrs, computations) for c in _called(instr.attrs, "calls"))
    return total


def _category(instr: _Instr, flops: float, convolution: bool = False) -> str:
    op = instr.opcode
    if op in _CONTAINERS:
        return CONTROL_FLOW
    if convolution:
        return "convolution"
    target = re.search(r'custom_call_target="([^"]*)"', instr.attrs)
    target = target.group(1).lower() if target else ""
    if flops > 0 or op == "dot" or "gemm" in target or "matmul" in target:
        return "matmul"
    if "fmha" in target or "attention" in target:
        return "attention"
    if op.removesuffix("-start").removesuffix("-done") in _COLLECTIVES:
        return "collective"
    if op in ("copy", "transpose", "copy-start", "copy-done"):
        return "copy/transpose"
    if op == "fusion":
        kind = re.search(r"kind=(\w+)", instr.attrs)
        return "reduction fusion" if kind and kind.group(1) == "kInput" else "elementwise fusion"
    if op in ("reduce", "reduce-window"):
        return "reduction fusion"
    return "other"


def _executions(instrs, computations, entry) -> tuple[dict[str, int], set[str]]:
    """Runs per module call of each scheduled computation (while bodies x their trip count), and
    the computations whose count is a guess (a loop without `known_trip_count` counts once)."""
    runs = {entry: 1}
    guessed: set[str] = set()
    stack = [entry]
    while stack:
        comp = stack.pop()
        for name in computations.get(comp, []):
            instr = instrs[name]
            children: list[tuple[str, int]] = []
            if instr.opcode == "while":
                known = _backend_config(instr.attrs).get("known_trip_count", {})
                trips = int(known.get("n", 1))
                children = [(c, trips) for c in _called(instr.attrs, "body")]
                children += [(c, trips + 1) for c in _called(instr.attrs, "condition")]
            elif instr.opcode == "conditional":
                children = [(c, 1) for c in _called(instr.attrs, "branch_computations")]
                children += [(c, 1) for c in _called(instr.attrs, "true_computation")]
                children += [(c, 1) for c in _called(instr.attrs, "false_computation")]
            elif instr.opcode == "call":
                children = [(c, 1) for c in _called(instr.attrs, "to_apply")]
            elif instr.opcode == "async-start":  # GPU: an op run on another stream
                children = [(c, 1) for c in _called(instr.attrs, "calls")]
            for child, times in children:
                if child not in runs:
                    runs[child] = runs[comp] * times
                    stack.append(child)
                    if comp in guessed or (instr.opcode == "while" and not known):
                        guessed.add(child)
    return runs, guessed


def index_module(hlo_text: str) -> dict[str, Op]:
    """Every instruction of the module that runs as a kernel, or holds ones that do (CONTROL_FLOW),
    by name (the trace's `hlo_op`)."""
    instrs, computations, entry = parse_module(hlo_text)
    runs, guessed = _executions(instrs, computations, entry)
    ops: dict[str, Op] = {}
    for comp, times in runs.items():
        for name in computations.get(comp, []):
            instr = instrs[name]
            if instr.opcode in _NO_KERNEL:
                continue
            if instr.opcode == "dot":
                flops = _matmul_flops(instr, instrs)
            elif instr.opcode == "convolution":
                flops = _convolution_flops(instr, instrs)
            elif instr.opcode == "custom-call":
                flops = _matmul_flops(instr, instrs) or _convolution_flops(instr, instrs)
            elif instr.opcode == "fusion":
                flops = sum(_fused_flops(c, instrs, computations) for c in _called(instr.attrs, "calls"))
            else:
                flops = 0.0
            source = re.search(r'op_name="([^"]*)"', instr.attrs)
            source = source.group(1) if source else ""
            category = _category(instr, flops, _is_convolution(instr, instrs, computations))
            ops[name] = Op(name, instr.opcode, category, flops, times, instr.shape, source, comp not in guessed)
    return ops
