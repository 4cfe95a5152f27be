"""`--dry-run --recommend`: search the layouts of N devices for the fastest train step that fits.

    python -m pax_eqx.train --exp gpt3_xl --dry-run --recommend --dry-run-devices 8 --dry-run-device-memory-gb 80

The search enumerates
  layouts       (stage, data, fsdp, context, tensor), each size an ICI factor x a DCN factor, whose
                product is the devices; the DCN factors multiply to the number of ICI domains (hosts
                on a GPU, slices on a TPU). tensor and context stay inside one ICI domain (their
                all-reduces and K/V all-gathers sit on every layer's critical path), context inside
                one host (each host reads its own rows, and a context group must share them:
                sharding/mesh.py); stage is the model's own pipeline stages (1 when it does not
                pipeline); the batch axes must divide the global batch; context > 1 only where they
                already leave one row a device and it divides the sequence (splitting the batch
                further saves the same activations and gathers no keys: context parallelism splits
                what the batch no longer can, a long row);
  remat         the policies of `lm_plan._POLICY_SAVED` (one per distinct memory/recompute pair);
  microbatches  gradient accumulation (learner.num_microbatches), powers of two that divide the batch;
  loss chunks   0 (the whole logits) or a quarter of the sequence (model.loss_chunk_size);
  pipeline microbatches (model.pipeline.num_microbatches) where the model pipelines,
prices each one's memory with the dry run's own model (`dry_run.MemoryModel`, the numbers `--dry-run`
prints for it), keeps those that fit, and ranks them by a predicted step time.

The time model, per device and step (T = batch x seq tokens, n devices, L layers, d model dims,
H hidden dims, N parameters, N_L of them in the layers):
  matmuls      (6 N + 12 L d S + what the remat policy recomputes: 4 L d S for the attention products,
               2 N_L + 4 L d S when it recomputes whole layers) x T / n, at peak x matmul_efficiency
               (PaLM's FLOP count, benchmarks/flops.py; MoE layers are counted as dense: an upper
               bound), divided by 1 - the pipeline bubble;
  traffic      what the elementwise ops read and write from HBM: 6 passes (forward; backward twice)
               over the (10 d + 2 H / tensor) activations of every layer and token of the device, and,
               where attention runs in XLA (not cuDNN's fused kernel), its float32 [heads, S, S] scores
               likewise;
  collectives  for an axis of ICI size i and DCN size c, an all-gather that leaves W bytes on every
               device moves (i - 1) / i x W over the ICI and (c - 1) / c x W / i over the DCN (the
               hierarchical ring); a reduce-scatter the same; an all-reduce twice that:
                 fsdp    the weights (float32, W = N x 4 / (tensor x stage)) gathered for the forward
                         and again for the backward and their gradients reduce-scattered: 3 W a
                         microbatch;
                 data    the gradients' all-reduce, of the fsdp shard, once a microbatch;
                 tensor  Megatron's 2 all-reduces a layer forward and 2 backward (2 more where the
                         policy recomputes the layers) of the [tokens, d] activations;
                 context the keys and values all-gathered a layer forward (2 more where the policy
                         recomputes the layers) and their gradients reduce-scattered backward, each
                         [rows, S, kv heads / tensor, head dim] (W = that); the gradients'
                         all-reduce also runs over context (a context shard holds every weight the
                         data shards do);
                 stage   each pipeline iteration's activations to the next stage, forward and back.
  step         matmuls + traffic + tensor + context + stage, + whatever fsdp and data collectives exceed the
               compute they overlap with (XLA schedules them asynchronously beside the layers).
MFU = 6 N + 12 L d S model FLOPs x T / (n x peak x step). The device constants and their sources are
in `device_kinds.py`. It is a model: it ranks layouts by where their bytes and FLOPs go; the
absolute times are as good as the one measurement the efficiency is fitted to.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.models.language_model import LanguageModelConfig
from pax_eqx.models.lm_plan import flash_attention
from pax_eqx.programs.plan.dry_run import MemoryModel, _group_name, as_run_on
from pax_eqx.programs.plan.text_width import command_lines, unbroken, wrap
from pax_eqx.sharding.device_kinds import DEVICE_KINDS, DeviceKind
from pax_eqx.sharding.mesh import AXES, full_shape, in_form, shortest_form
from pax_eqx.sharding.rules import parse_rules

GIB = 1024**3
# One policy per distinct (memory, recompute) pair; "everything_saveable" is "none" here.
REMAT_CHOICES = (
    "none",
    "dots_saveable",
    "dots_with_no_batch_dims_and_context",
    "dots_with_no_batch_dims_saveable",
    "save_qkv_context_and_out_proj",
    "save_context_and_out_proj",
    "full",
)
# What the backward recomputes under each policy (benchmarks/flops.py's table): the layers' whole
# forward, the attention products, or those only when they run as the fused kernel / as XLA dots.
_RECOMPUTED = {
    "none": "nothing",
    "everything_saveable": "nothing",
    "dots_saveable": "attention_if_fused",
    "dots_with_no_batch_dims_saveable": "attention",
    "dots_with_no_batch_dims_and_context": "attention_unless_fused",
    "save_context_and_out_proj": "layers",
    "save_qkv_context_and_out_proj": "layers",
    "full": "layers",
}
TOP = 5


@dataclass(frozen=True)
class Layout:
    """(stage, data, fsdp, context, tensor) sizes inside an ICI domain and across the DCN; given
    as any mesh shape form (3, 4 or 5 entries: `mesh.SHAPE_FORMS`), kept as the five."""

    ici: tuple[int, ...]
    dcn: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ici", full_shape(self.ici))
        object.__setattr__(self, "dcn", full_shape(self.dcn))

    @property
    def shape(self) -> dict[str, int]:
        return {a: i * c for a, i, c in zip(AXES, self.ici, self.dcn)}

    @property
    def form(self) -> tuple[str, ...]:
        """The mesh axes its flags and its row name: (data, fsdp, tensor), with stage and context
        where they are more than 1 (`mesh.shortest_form`)."""
        return shortest_form(self.ici, self.dcn)

    def text(self, form: tuple[str, ...] | None = None) -> str:
        """Its sizes for the axes `form` (by default its own), ICI x DCN (the DCN left out when it is all 1)."""
        form = self.form if form is None else form
        ici, dcn = in_form(self.ici, form), in_form(self.dcn, form)
        return " ".join(map(str, ici)) + ("" if math.prod(dcn) == 1 else " x " + " ".join(map(str, dcn)))


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step by where they go (see the module docstring)."""

    matmul: float
    traffic: float
    fsdp: float
    data: float
    tensor: float
    stage: float
    context: float = 0.0

    @property
    def total(self) -> float:
        compute = self.matmul + self.traffic
        return compute + self.tensor + self.context + self.stage + max(0.0, self.fsdp + self.data - compute)

    def parts(self) -> dict[str, float]:
        """The step's seconds by cause; they add up to `total`."""
        return {
            "matmuls": self.matmul,
            "HBM traffic": self.traffic,
            "tensor all-reduces": self.tensor,
            "context K/V gathers": self.context,
            "stage sends": self.stage,
            "fsdp/data collectives": max(0.0, self.fsdp + self.data - self.matmul - self.traffic),
        }

    def largest_cost(self) -> str:
        parts = self.parts()
        return max(parts, key=parts.get)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    remat: str
    microbatches: int
    loss_chunk: int
    pipeline_microbatches: int
    memory: int
    time: StepTime
    mfu: float

    def key(self) -> tuple:
        return (float(f"{self.time.total:.4g}"), self.microbatches, self.memory)  # equal to 4 digits: a tie


@dataclass(frozen=True)
class Recommendation:
    text: str
    best: Candidate | None
    flags: list[str]


def recommend(
    exp: ExperimentConfig,
    num_devices: int,
    device_memory_gb: float | None,
    kind_name: str = "h100",
    devices_per_host: int | None = None,
    ici_size: int | None = None,
    base_argv: list[str] | None = None,
    width: int | None = None,
) -> Recommendation:
    """The ranked table (text), the winner and the flags that select it. width: the columns the
    text fits (`_table` abbreviates and drops columns to fit, prose and commands are broken at
    spaces; the program passes the terminal's); None: every line whole."""
    kind = DEVICE_KINDS[kind_name]
    memory_gb = kind.memory_gib if device_memory_gb is None else device_memory_gb
    other_kind = exp.mesh.device_kind != kind_name  # the commands printed say what the layouts are for
    exp = exp.replace(mesh=exp.mesh.replace(device_kind=kind_name))
    per_host = devices_per_host or kind.devices_per_host
    if num_devices < 1 or num_devices % per_host and num_devices > per_host:
        raise ConfigError(
            f"--dry-run-devices {num_devices} is not a whole number of hosts of {per_host} devices "
            f"(--dry-run-devices-per-host); use a multiple of {per_host}."
        )
    ici = ici_size or (min(per_host, num_devices) if kind.ici_is_host else num_devices)
    if num_devices % ici:
        raise ConfigError(
            f"--dry-run-ici-size {ici} does not divide --dry-run-devices {num_devices}: the devices are whole ICI "
            f"domains (hosts on a GPU, slices on a TPU); use a divisor of {num_devices}."
        )
    if not exp.model.prices_step_time:
        raise ConfigError(
            f"--recommend prices a language model's step (its time and activation model); the model of "
            f"{exp.name} is a {type(exp.model).__name__}; plan its layouts with --dry-run and --mesh flags."
        )
    planned = as_run_on(exp, kind)  # attention "auto" is XLA's on a TPU
    xla_attention = planned is not exp
    exp = planned
    exp.validate(data_files=False)
    memory_model = MemoryModel(exp)
    stages = exp.model.pipeline.num_stages if _pipelined(exp.model) else 1
    batch = exp.data.train.batch_size
    table = parse_rules(exp.mesh.rules)
    host, seq = min(per_host, num_devices), exp.data.seq_len
    layouts = [lay for lay in _layouts(num_devices, ici, stages) if _searched(lay, batch, seq, host, table)]
    if not layouts:
        least = min(_ways(lay.shape, table["batch"]) for lay in _layouts(num_devices, ici, stages))
        raise ConfigError(
            f"--recommend: no layout of {num_devices} devices ({ici} per ICI domain"
            f"{f', {stages} pipeline stages' if stages > 1 else ''}) splits data.train.batch_size={batch} over its "
            f"batch axes ({' x '.join(table['batch'])}: at least {least} ways); use a multiple of {least} "
            f"(--data.train.batch-size) or fewer devices."
        )
    sizes = model_sizes(memory_model)
    candidates = []
    for layout in layouts:
        for variant, choice in _variants(exp, layout, table):
            memory = memory_model.bytes_for(variant).total
            time = step_time(variant, layout, kind, sizes)
            mfu = sizes.model_flops_per_token * batch * exp.data.seq_len / (num_devices * kind.peak_flops * time.total)
            candidates.append(Candidate(layout, *choice, memory, time, mfu))
    fit = [c for c in candidates if c.memory <= memory_gb * GIB]
    fit = _best_per_setting(fit)
    fit.sort(key=Candidate.key)
    header = (
        f"Dry run of {exp.name}: recommending a layout for {num_devices} x {kind.name} "
        f"({_count(num_devices // min(per_host, num_devices), 'host')} of {min(per_host, num_devices)}; "
        f"{_count(num_devices // ici, 'ICI domain')} of {ici} over DCN), {memory_gb:.4g} GiB each, "
        f"global batch {batch} x {exp.data.seq_len}"
    )
    prose = [header, f"Searched {len(candidates):,} settings over {len(layouts)} layouts; {len(fit):,} fit."]
    if exp.train.fprop_dtype != "bfloat16":
        prose.append(
            f"Note: the experiment computes in {exp.train.fprop_dtype}; times are priced at the bf16 peak "
            "(--train.fprop-dtype bfloat16 runs at it)."
        )
    lines = [line for text in prose for line in wrap(text, width, "  ")]
    if not fit:
        least = min(candidates, key=lambda c: c.memory)
        lines += wrap(
            f"Nothing fits {memory_gb:.4g} GiB: the least memory is {unbroken(_size(least.memory))} "
            f"({_describe(least)}); use more devices, devices with more memory, or a smaller batch.",
            width, "  ",
        )  # fmt: skip
        return Recommendation("\n".join(lines), None, [])
    lines += _table(fit[:TOP], stages, len(layouts), width)
    if any(c.remat == "none" for c in fit[:TOP]):
        lines += wrap(
            "  remat none: its activations are under-counted (gpt3_xl at batch 8: 65.6 GiB planned, out of memory "
            "on an 80 GiB H100; docs/performance.md): try such a row before relying on it.",
            width, "    ",
        )  # fmt: skip
    lines += wrap(_why_others_lose(fit[0], fit[:TOP], candidates, memory_gb), width, "  ")
    best = fit[0]
    flags = _flags(exp, best) + (["--model.block.attention.implementation", "xla"] if xla_attention else [])
    flags += ["--mesh.device-kind", kind_name] if other_kind else []
    base = _strip(base_argv or ["--exp", exp.name])
    train = ["python", "-m", "pax_eqx.train", *base, "--job-log-dir", f"runs/{exp.name}", *flags]
    check = ["python", "-m", "pax_eqx.train", *base, *flags, "--dry-run",
             "--dry-run-device-memory-gb", f"{memory_gb:g}"]  # fmt: skip
    lines += command_lines("Train the best: ", train, width) + command_lines("Its dry run:    ", check, width)
    return Recommendation("\n".join(lines), best, flags)


# Search ---------------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    """n's divisors, ascending, by trial division up to sqrt(n): a billion devices take
    milliseconds (a scan of 1..n took minutes before refusing them)."""
    small = [f for f in range(1, math.isqrt(n) + 1) if n % f == 0]
    return small + [n // f for f in reversed(small) if f * f != n]


def _factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered tuple of `parts` positive ints whose product is n."""
    if parts == 1:
        return [(n,)]
    return [(f, *rest) for f in _divisors(n) for rest in _factorisations(n // f, parts - 1)]


def _layouts(num_devices: int, ici: int, stages: int) -> list[Layout]:
    """(stage, data, fsdp, context, tensor) splits: stage the model's own, context and tensor
    inside the ICI domain."""
    dcn = num_devices // ici
    found = []
    for stage_ici in (f for f in range(1, stages + 1) if stages % f == 0 and ici % f == 0):
        stage_dcn = stages // stage_ici
        if dcn % stage_dcn:
            continue
        for data_i, fsdp_i, context_i, tensor_i in _factorisations(ici // stage_ici, 4):
            for data_c, fsdp_c in _factorisations(dcn // stage_dcn, 2):
                found.append(
                    Layout((stage_ici, data_i, fsdp_i, context_i, tensor_i), (stage_dcn, data_c, fsdp_c, 1, 1))
                )
    return found


def _searched(layout: Layout, batch: int, seq: int, per_host: int, table: dict) -> bool:
    """Whether the search prices `layout`: its batch axes divide the global batch, and a context
    axis only where they leave one row a device, it divides the sequence and it fits in a host
    (module docstring)."""
    ways = _ways(layout.shape, table["batch"])
    if batch % ways:
        return False
    context = _ways(layout.shape, table["seq"])
    return context == 1 or (batch == ways and seq % context == 0 and per_host % context == 0)


def _ways(shape: dict[str, int], axes: tuple[str, ...]) -> int:
    return math.prod(shape[a] for a in axes)


def _variants(exp: ExperimentConfig, layout: Layout, table: dict) -> Any:
    """(the experiment on this layout with one setting, (remat, microbatches, chunk, pipeline mb))."""
    m = exp.model
    batch, seq = exp.data.train.batch_size, exp.data.seq_len
    rows = batch // _ways(layout.shape, table["batch"])  # per device
    mesh = exp.mesh.replace(ici_mesh_shape=layout.ici, dcn_mesh_shape=layout.dcn)
    chunks = sorted({0, seq // 4}) if seq >= 8 else [0]
    pipe = m.pipeline if _pipelined(m) else None
    remats = [r for r in REMAT_CHOICES if not (pipe is not None and pipe.remat_stage and r == "none")]  # refused
    for remat, chunk in itertools.product(remats, chunks):
        model = m.replace(remat_policy=remat, loss_chunk_size=chunk)
        for micro in (k for k in _powers_of_two(rows) if rows % k == 0):
            learner = exp.learner.replace(num_microbatches=micro)
            if pipe is None:
                yield exp.replace(mesh=mesh, model=model, learner=learner), (remat, micro, chunk, 1)
                continue
            stage_rows = batch // micro // _ways(layout.shape, tuple(a for a in table["batch"] if a != "stage"))
            for pm in _powers_of_two(stage_rows):
                if stage_rows % pm or (pipe.circular_repeat > 1 and pm < pipe.num_stages):
                    continue
                piped = model.replace(pipeline=pipe.replace(num_microbatches=pm))
                yield exp.replace(mesh=mesh, model=piped, learner=learner), (remat, micro, chunk, pm)


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(max(limit, 1))) + 1)]


def _best_per_setting(fit: list[Candidate]) -> list[Candidate]:
    """One row per (layout, remat, microbatches, pipeline microbatches): the loss chunk with the
    least memory (the chunked loss costs no time: it does the same matmuls)."""
    best: dict[tuple, Candidate] = {}
    for c in fit:
        k = (c.layout, c.remat, c.microbatches, c.pipeline_microbatches)
        if k not in best or (c.time.total, c.memory) < (best[k].time.total, best[k].memory):
            best[k] = c
    return list(best.values())


def _pipelined(m: LanguageModelConfig) -> bool:
    return m.pipeline is not None and m.pipeline.enabled


# Time model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSizes:
    """What the time model reads off the parameters: their count, those inside the layer stack
    (what full remat recomputes), and PaLM's model FLOPs per token (6 N + 12 L d S)."""

    params: int
    layer_params: int
    model_flops_per_token: float


def model_sizes(memory_model: MemoryModel) -> ModelSizes:
    m, seq = memory_model.exp.model, memory_model.exp.data.seq_len
    layer = sum(leaf.size for path, leaf in memory_model.leaves if _group_name(path).startswith("stack."))
    n = memory_model.param_count
    return ModelSizes(n, layer, 6.0 * n + 12.0 * m.num_layers * m.model_dims * seq)


def _collective(nbytes: float, layout: Layout, axis: str | tuple[str, ...], kind: DeviceKind) -> float:
    """Seconds of an all-gather (or reduce-scatter) leaving `nbytes` on each device, over `axis`
    (or over several axes as one: their ICI and DCN sizes multiplied)."""
    axes = (axis,) if isinstance(axis, str) else axis
    i = math.prod(layout.ici[AXES.index(a)] for a in axes)
    c = math.prod(layout.dcn[AXES.index(a)] for a in axes)
    return (i - 1) / i * nbytes / kind.ici_bytes_per_s + (c - 1) / c * nbytes / i / kind.dcn_bytes_per_s


def step_time(exp: ExperimentConfig, layout: Layout, kind: DeviceKind, sizes: ModelSizes) -> StepTime:
    """The predicted seconds of one train step of `exp` on `layout`, by cause (module docstring)."""
    m = exp.model
    shape = layout.shape
    n = math.prod(shape.values())
    seq, d, h, layers = exp.data.seq_len, m.model_dims, m.hidden_dims, m.num_layers
    tokens = exp.data.train.batch_size * seq
    nbytes = 2 if exp.train.fprop_dtype == "bfloat16" else 4
    flash = flash_attention(m, exp.train.fprop_dtype, _ways(shape, parse_rules(exp.mesh.rules)["seq"]) > 1)
    attention = 4.0 * layers * d * seq
    recomputed = _RECOMPUTED[m.remat_policy]
    flops = sizes.model_flops_per_token
    if recomputed == "layers":
        flops += 2.0 * sizes.layer_params + attention
    elif (
        recomputed == "attention"
        or (recomputed == "attention_if_fused" and flash)
        or (recomputed == "attention_unless_fused" and not flash)
    ):
        flops += attention
    bubble = m.pipeline.bubble_fraction if _pipelined(m) else 0.0
    matmul = flops * tokens / n / (kind.peak_flops * kind.matmul_efficiency) / (1.0 - bubble)
    stage, tensor, context = shape["stage"], shape["tensor"], shape["context"]
    # every tensor/stage peer sees the same tokens; a context peer the same rows' other tokens
    device_tokens = tokens / (shape["data"] * shape["fsdp"] * context)
    layer_tokens = device_tokens * layers / stage
    traffic = 6 * layer_tokens * (10 * d + 2 * h / tensor) * nbytes
    if not flash:
        traffic += 6 * layer_tokens * (m.num_heads / tensor) * seq * 4
    micro = exp.learner.num_microbatches
    weights = sizes.params * 4 / (tensor * stage)
    fsdp = 3 * micro * _collective(weights, layout, "fsdp", kind)
    data = 2 * micro * _collective(weights / shape["fsdp"], layout, ("data", "context"), kind)
    all_reduces = 6 if recomputed == "layers" else 4
    tensor_s = all_reduces * (layers / stage) * 2 * _collective(device_tokens * d * nbytes, layout, "tensor", kind)
    context_s = 0.0
    if context > 1:
        kv_bytes = 2 * device_tokens * context * (m.num_kv_heads or m.num_heads) / tensor * m.head_dim * nbytes
        gathers = 3 if recomputed == "layers" else 2  # forward (and its recompute), then the gradients' reduce-scatter
        context_s = gathers * (layers / stage) * _collective(kv_bytes, layout, "context", kind)
    stage_s = 0.0
    if _pipelined(m) and stage > 1:
        p = m.pipeline
        hop = device_tokens / micro / p.num_microbatches * d * nbytes
        link = kind.dcn_bytes_per_s if layout.dcn[0] > 1 else kind.ici_bytes_per_s
        stage_s = 2 * p.num_iterations * micro * hop / link
    return StepTime(matmul, traffic / kind.hbm_bytes_per_s, fsdp, data, tensor_s, stage_s, context_s)


# Text -----------------------------------------------------------------------------------------
# Under the terminal's width, the table shortens in this order until it fits: the remat policies'
# names (a legend under the table says them whole), the causes of the step time, the mesh column's
# header (the line under the table names its axes), one space between columns, no cause column.
_REMAT_SHORT = {
    "none": "none",
    "everything_saveable": "everything",
    "dots_saveable": "dots",
    "dots_with_no_batch_dims_saveable": "dots_nb",
    "dots_with_no_batch_dims_and_context": "dots_nb_ctx",
    "save_context_and_out_proj": "ctx_out",
    "save_qkv_context_and_out_proj": "qkv_ctx_out",
    "full": "full",
}
_COST_SHORT = {
    "matmuls": "matmuls",
    "HBM traffic": "HBM",
    "tensor all-reduces": "tensor",
    "context K/V gathers": "context",
    "stage sends": "stage",
    "fsdp/data collectives": "fsdp/data",
}
_SHORTENINGS = ("remat", "cost", "mesh", "gap", "no cost")


def _table(rows: list[Candidate], stages: int, searched: int, width: int | None) -> list[str]:
    """The ranked rows, with their header and the lines that explain them, in `width` columns
    (None: unshortened): each shortening of `_SHORTENINGS` in turn until the table fits."""
    form = shortest_form(*(shape for c in rows for shape in (c.layout.ici, c.layout.dcn)))  # one for every row
    axes = " ".join(form)
    for n in range(len(_SHORTENINGS) + 1):
        short = set(_SHORTENINGS[:n])
        table = _table_lines(rows, stages, form, short)
        if width is None or max(map(len, table)) <= width:
            break
    mesh = f"mesh: {axes} sizes" if "mesh" in short else "mesh sizes"
    notes = [f"  ({mesh} inside an ICI domain x across the DCN; {_count(searched, 'layout')} searched)"]
    legends = [("remat", "remat", _REMAT_SHORT, sorted({c.remat for c in rows}))]
    if "no cost" not in short:
        legends.append(("cost", "most time in", _COST_SHORT, sorted({c.time.largest_cost() for c in rows})))
    for step, label, names, shown in legends:
        said = [f"{names[name]} = {name}" for name in shown if names[name] != name]
        if step in short and said:
            notes.append(f"  ({label}: {', '.join(said)})")
    return table + [line for note in notes for line in wrap(note, width, "   ")]


def _table_lines(rows: list[Candidate], stages: int, form: tuple[str, ...], short: set[str]) -> list[str]:
    """The header and the rows (their meshes in the axes `form`), each column as wide as its widest cell."""
    remat = (lambda r: _REMAT_SHORT.get(r, r)) if "remat" in short else (lambda r: r)
    cost = (lambda k: _COST_SHORT[k]) if "cost" in short else (lambda k: k)
    columns: list[tuple[str, str, list[str]]] = [  # (header, alignment, cells)
        ("#", ">", [str(i) for i in range(1, len(rows) + 1)]),
        ("mesh" if "mesh" in short else " ".join(form), "<", [c.layout.text(form) for c in rows]),
        ("remat", "<", [remat(c.remat) for c in rows]),
        ("micro", ">", [str(c.microbatches) for c in rows]),
        ("chunk", ">", [str(c.loss_chunk) for c in rows]),
        *([("pipe-mb", ">", [str(c.pipeline_microbatches) for c in rows])] if stages > 1 else []),
        ("memory", ">", [_size(c.memory) for c in rows]),
        ("step", ">", [_seconds(c.time.total) for c in rows]),
        ("MFU", ">", [f"{c.mfu:.1%}" for c in rows]),
        *([] if "no cost" in short else [("most time in", "<", [cost(c.time.largest_cost()) for c in rows])]),
    ]
    gap = " " if "gap" in short else "  "
    sizes = [max(len(header), *map(len, cells)) for header, _, cells in columns]

    def line(cells: list[str]) -> str:
        padded = [f"{cell:{align}{size}}" for cell, (_, align, _), size in zip(cells, columns, sizes)]
        return ("  " + gap.join(padded)).rstrip()

    return [line([header for header, _, _ in columns])] + [
        line([cells[i] for _, _, cells in columns]) for i in range(len(rows))
    ]


def _mesh_label(layout: Layout) -> str:
    """`data fsdp tensor` sizes (with `stage` first when it pipelines), ICI x DCN; a layout with a
    context axis names its five axes, (stage data fsdp context tensor)."""
    return layout.text() + (f" ({' '.join(layout.form)})" if "context" in layout.form else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _describe(c: Candidate) -> str:
    micro = f"{c.microbatches} microbatch{'' if c.microbatches == 1 else 'es'}"
    return f"mesh {unbroken(_mesh_label(c.layout))}, remat {c.remat}, {micro}, loss chunk {c.loss_chunk}"


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms" if s >= 0.1 else f"{s * 1e3:.3g} ms"


def _size(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def _why_others_lose(best: Candidate, shown: list[Candidate], candidates: list[Candidate], memory_gb: float) -> str:
    """One line: the fastest settings left out for memory, and the best mesh left out of the table
    with the cost by which it loses to the winner."""
    too_big = (c for c in candidates if c.memory > memory_gb * GIB)
    faster = sorted((c for c in too_big if c.key() < best.key()), key=Candidate.key)
    said = []
    if faster:
        top = faster[0]
        said.append(
            f"{len(faster):,} faster settings do not fit {memory_gb:.4g} GiB (the fastest, {_describe(top)}, "
            f"{unbroken(_seconds(top.time.total))}, needs {unbroken(_size(top.memory))})"
        )
    meshes = {c.layout for c in shown}
    fits = [c for c in candidates if c.memory <= memory_gb * GIB and c.layout not in meshes]
    if fits:
        other = min(fits, key=Candidate.key)
        mine, theirs = best.time.parts(), other.time.parts()
        cause = max(theirs, key=lambda k: theirs[k] - mine[k])
        loses = (
            f"+{unbroken(_seconds(theirs[cause] - mine[cause]))} of {cause}"
            if other.time.total > best.time.total * (1 + 1e-6)
            else f"as fast, but {unbroken(_size(other.memory))}"
        )
        mesh, step = unbroken(_mesh_label(other.layout)), unbroken(_seconds(other.time.total))
        said.append(f"the best mesh not shown, {mesh}, takes {step}: {loses}")
    return "Rejected: " + ("; ".join(said) if said else "nothing else was searched") + "."


_SET_BY_RECOMMEND = (
    "--mesh.ici-mesh-shape", "--mesh.dcn-mesh-shape", "--model.remat-policy", "--learner.num-microbatches",
    "--model.loss-chunk-size", "--model.pipeline.num-microbatches",
    "--dry-run", "--recommend", "--dry-run-devices", "--dry-run-device-memory-gb", "--dry-run-device-kind",
    "--dry-run-devices-per-host", "--dry-run-ici-size", "--model.block.attention.implementation",
)  # fmt: skip


def _strip(argv: list[str]) -> list[str]:
    """The user's flags without the dry run's and those the recommendation sets (with their values)."""
    out, skipping = [], False
    for word in argv:
        if word.startswith("--"):
            skipping = word.split("=", 1)[0].replace("_", "-") in _SET_BY_RECOMMEND
        if not skipping:
            out.append(word)
    return out


def _flags(exp: ExperimentConfig, c: Candidate) -> list[str]:
    """The flags that select candidate `c` (the mesh always; the rest where they change)."""
    form = c.layout.form
    flags = ["--mesh.ici-mesh-shape", *map(str, in_form(c.layout.ici, form))]
    if math.prod(c.layout.dcn) > 1:
        flags += ["--mesh.dcn-mesh-shape", *map(str, in_form(c.layout.dcn, form))]
    if c.remat != exp.model.remat_policy:
        flags += ["--model.remat-policy", c.remat]
    if c.microbatches != exp.learner.num_microbatches:
        flags += ["--learner.num-microbatches", str(c.microbatches)]
    if c.loss_chunk != exp.model.loss_chunk_size:
        flags += ["--model.loss-chunk-size", str(c.loss_chunk)]
    if _pipelined(exp.model) and c.pipeline_microbatches != exp.model.pipeline.num_microbatches:
        flags += ["--model.pipeline.num-microbatches", str(c.pipeline_microbatches)]
    return flags
