"""ExperimentConfig: one frozen config that says everything about a run (Pax's experiment class).

Pax experiments are classes whose constants (NUM_LAYERS, ICI_MESH_SHAPE, ...) and `task()` /
`datasets()` methods define a run. Here an experiment is a value of this dataclass: named
experiments in `experiments/` are functions returning one, the CLI overrides any nested field
(`--model.num-layers 4`), and the resolved value is written to `DIR/config.json`.

`validate()` checks every cross-field constraint up front -- mesh vs devices, batch vs mesh,
eval table, sequence length vs model -- so bad combinations fail before anything is written.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax

from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.config import SEED_MAX, Config, ConfigError, check_range, config
from pax_eqx.data import DataConfig
from pax_eqx.learners import LearnerConfig
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.models.decoding import SampleConfig, check_utf8
from pax_eqx.models.language_model import LanguageModelConfig
from pax_eqx.models.model import ModelConfig
from pax_eqx.quantization.quantization_choice import NoQuantizationConfig, QuantizationConfig
from pax_eqx.sharding.mesh import AXES, MeshConfig
from pax_eqx.sharding.rules import parse_rules
from pax_eqx.task_config import TaskConfig


@config
class EarlyStoppingConfig(Config):
    """Stop training on an eval metric (Pax's EarlyStoppingFn), at an eval step: a checkpoint is
    saved, the reason printed, and the run exits 0; rerunning the command does not train on.

    metric: the eval metric to watch ("log_pplx", "total_loss", "accuracy", ...; "" = off).
    mode: "min" (lower is better) or "max".
    patience: stop after this many evals in a row without an improvement of more than
        min_delta over the best so far (0 = no patience rule).
    min_delta: the smallest change that counts as an improvement.
    target: stop once the metric reaches this value (<= in mode min, >= in max; 0 = off), e.g.
        Pax's GPT-3 target log-perplexity 2.69.
    """

    metric: str = ""
    mode: Literal["min", "max"] = "min"
    patience: int = 0
    min_delta: float = 0.0
    target: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "train.early_stopping"
        check_range(self, "patience", ge=0, prefix=where, note="0 = no patience rule")
        check_range(self, "min_delta", ge=0, prefix=where, note="0 = any improvement counts")
        check_range(self, "target", prefix=where, note="0 = no target")
        if self.mode not in ("min", "max"):
            raise ConfigError(f"{where}.mode={self.mode!r} is not one of ('min', 'max').")
        defaults = EarlyStoppingConfig.__dataclass_fields__
        if not self.metric:
            for name in ("mode", "patience", "min_delta", "target"):
                if getattr(self, name) != defaults[name].default:
                    raise ConfigError(
                        f"{where}.{name}={getattr(self, name)!r} has no effect without {where}.metric; name the eval "
                        f"metric to watch (e.g. --train.early-stopping.metric log_pplx) or leave {name} at its default."
                    )
            return
        if not self.patience and not self.target:
            raise ConfigError(
                f"{where}.metric={self.metric!r} with neither {where}.patience nor {where}.target set never stops "
                "the run; set patience (evals without improvement) or target (the value to reach)."
            )
        if self.min_delta and not self.patience:
            raise ConfigError(
                f"{where}.min_delta={self.min_delta} has no effect with {where}.patience=0; set patience or leave "
                "min_delta at 0."
            )


@config
class TrainConfig(Config):
    """num_steps: total training steps (a resumed run continues up to it).
    eval_interval_steps: evaluate every N steps (0 = only at the end).
    summary_interval_steps: log train metrics every N steps (the only host sync in the loop).
    seed: initialises parameters and the dropout key.
    fprop_dtype: activation/compute dtype; parameters stay float32.
    sample_at_end: after training, print a sample decoded from `decode.prompt` (models that decode).
    layer_summaries: record the layers' statistics (per-layer activation RMS, the attention
      logits' max; Pax's summary verbosity 4) with the train and eval metrics. Off by default:
      then they are not even traced, so the step is as fast.
    steps_per_loop: train steps per compiled call (a lax.scan over that many batches, as TPU
      infeed loops run several steps per host round trip): the host dispatches, feeds and
      syncs once per loop. Any interval works: the steps up to an eval, summary, decode or
      checkpoint step a loop would pass run one a call, so every event falls at a call's end;
      the result is the same training, step for step.
    early_stopping: stop on an eval metric (patience, min_delta, mode, target); off by default.
    decode_interval_steps: every N steps, decode `decode.num_samples` samples of `decode.prompt`
      (models that decode) and log them to metrics.jsonl (split "decode", key "samples") and
      as TensorBoard text (0 = off; `sample_at_end` still prints one at the end).
    trackers: experiment trackers that also get the train and eval scalars, the config and the
      command ("wandb", "mlflow"; each an optional extra; docs/trackers.md). A resumed run
      continues the same tracker run (its id is kept in DIR/trackers.json).
    tracker_project: the W&B project and the MLflow experiment ("" = WANDB_PROJECT /
      MLFLOW_EXPERIMENT_NAME if set, else the experiment's name).
    tracker_run_name: the run's name in the trackers ("" = WANDB_NAME if set, else the job dir's name).
    mlflow_tracking_uri: where MLflow records ("" = MLFLOW_TRACKING_URI if set, else MLflow's default).
    """

    num_steps: int = 1000
    eval_interval_steps: int = 100
    summary_interval_steps: int = 10
    seed: int = 1234
    fprop_dtype: Literal["float32", "bfloat16"] = "float32"
    sample_at_end: bool = True
    layer_summaries: bool = False
    steps_per_loop: int = 1
    early_stopping: EarlyStoppingConfig = EarlyStoppingConfig()
    decode_interval_steps: int = 0
    trackers: tuple[Literal["wandb", "mlflow"], ...] = ()
    tracker_project: str = ""
    tracker_run_name: str = ""
    mlflow_tracking_uri: str = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(
            self, "num_steps", gt=0, prefix="train", note="the step a run trains up to",
            fix="Pass e.g. --train.num-steps 1000.",
        )  # fmt: skip
        for name in ("eval_interval_steps", "summary_interval_steps"):
            flag = "--train." + name.replace("_", "-")
            check_range(self, name, ge=0, prefix="train", note="0 = only at the end", fix=f"Pass e.g. {flag} 100.")
        check_range(self, "seed", ge=0, le=SEED_MAX, prefix="train")
        check_range(self, "steps_per_loop", ge=1, le=10_000, prefix="train", note="1 = one step per call")
        check_range(self, "decode_interval_steps", ge=0, prefix="train", note="0 = off")
        self._check_trackers()
        if self.early_stopping.metric and not self.eval_interval_steps:
            raise ConfigError(
                f"train.early_stopping.metric={self.early_stopping.metric!r} with train.eval_interval_steps=0: the "
                "run evaluates only at the end, so it can never stop early; set --train.eval-interval-steps."
            )

    def _check_trackers(self) -> None:
        if len(set(self.trackers)) != len(self.trackers):
            raise ConfigError(f"train.trackers={self.trackers} names a tracker twice; name each once.")
        read_by = {"tracker_project": ("wandb", "mlflow"), "tracker_run_name": ("wandb", "mlflow")}
        for name, trackers in {**read_by, "mlflow_tracking_uri": ("mlflow",)}.items():
            if getattr(self, name) and not set(trackers) & set(self.trackers):
                raise ConfigError(
                    f"train.{name}={getattr(self, name)!r} has no effect without {' or '.join(trackers)} in "
                    f"train.trackers (now {self.trackers}); add "
                    + " or ".join(f"--train.trackers {t}" for t in trackers)
                    + " or drop the flag."
                )


@config
class DecodeConfig(SampleConfig):
    """What decode (and the sample at the end of training) prints.

    prompt: text to continue (a sequence-to-sequence model: its input, sentinels written
      <extra_id_N>; empty = the first eval examples).
    num_samples: continuations to print (a sequence-to-sequence model without a prompt, a
      classifier without inputs: eval examples to decode; a beam prints one n-best list).
    inputs: files to decode instead of eval examples, for a model that decodes examples (a
      classifier: images, or .npy arrays of its input shape); () = the eval split.
    """

    prompt: str = "ROMEO:"
    num_samples: int = 1
    inputs: tuple[str, ...] = ()

    def validate(self) -> None:
        """SampleConfig's checks, the prompt's text and the sample count."""
        check_utf8(self.prompt)  # first: a prompt that is not text is the error to see
        super().validate()
        check_range(self, "num_samples", gt=0, prefix="decode")


@config
class ProfileConfig(Config):
    """steps: (first, last) training steps to trace with the JAX profiler into DIR/profile/; () = off.
    auto_pgle: turn on XLA's automatic profile-guided latency estimation (GPU)."""

    steps: tuple[int, ...] = ()
    auto_pgle: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "steps", ge=0, prefix="profile")
        if self.steps and (len(self.steps) != 2 or self.steps[0] > self.steps[1]):
            raise ConfigError(
                f"profile.steps must be (first, last) with first <= last, got {self.steps}; "
                "pass e.g. --profile.steps 10 20, or nothing for no profile."
            )


@config
class ExperimentConfig(Config):
    """One run: everything an experiment decides, each part overridable from the command line.

    name: the experiment's name (printed, and recorded in config.json).
    model: the model family and its sizes (a LanguageModelConfig, a ClassificationModelConfig, a
      SequenceModelConfig or a user's own ModelConfig).
    learner: the optimizer, its learning-rate schedule, clipping, EMA and microbatches.
    task: which losses are minimised, their weights, aux losses and variational noise.
    data: where examples come from, their tokenizer, and the train and eval inputs.
    train: how long to train, how often to evaluate and log, the seed and activation dtype.
    checkpoint: how often checkpoints are written and how many are kept.
    mesh: the device mesh (data, fsdp, tensor; stage and context where set), ICI x DCN, and the sharding rules.
    decode: what decode and the end of training print.
    profile: JAX profiler traces and XLA's profile-guided latency estimation.
    lora: low-rank adapters on chosen weights of a trained base, which stays frozen (off by default).
    quantization: none, quantization-aware training (fake_quant, aqt) or the materialized int model
      `python -m pax_eqx.quantize` writes (int): bits, symmetric, clipping, activations, which layers
      (pax_eqx/quantization/quantization_choice.py; docs/quantize.md).
    """

    name: str = ""
    model: ModelConfig = LanguageModelConfig()
    learner: LearnerConfig = LearnerConfig()
    task: TaskConfig = TaskConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    mesh: MeshConfig = MeshConfig()
    decode: DecodeConfig = DecodeConfig()
    profile: ProfileConfig = ProfileConfig()
    lora: LoraConfig = LoraConfig()
    quantization: QuantizationConfig = NoQuantizationConfig()

    def unfed_metrics(self) -> dict[str, str]:
        """{metric: why} for the eval metrics this model or data cannot feed (metric_fns.unfeedable):
        refused when the user names them, skipped when they are the experiment's own."""
        from pax_eqx.data.data_config import has_text
        from pax_eqx.metric_fns import unfeedable

        model = type(self.model)
        return unfeedable(
            self.data.eval.metrics, model.per_example_keys, model.decodes_inputs, has_text(self.data), model.__name__
        )

    def inert_fields(self) -> dict[str, str]:
        """Decoding options the model's kind of decoding does not read: a language model reads
        no `decode.inputs`; a model that decodes examples (a classifier) reads only
        `decode.num_samples` and `decode.inputs`, and nothing samples during or after training.
        And `data.eval.metrics` naming a metric the model or data cannot feed."""
        unfed = self.unfed_metrics()
        if unfed:
            return {**self._decode_inert_fields(), "data.eval.metrics": "; ".join(unfed.values())}
        return self._decode_inert_fields()

    def _decode_inert_fields(self) -> dict[str, str]:
        model = type(self.model)
        if model.fills_prompts:
            why = f"the model ({model.__name__}) fills decode.prompt's masks with its argmax; it reads nothing else"
            return {f"decode.{f.name}": why for f in dataclasses.fields(self.decode) if f.name != "prompt"}
        if model.decodes:
            why = f"the model ({model.__name__}) continues a prompt; decode.inputs are files for a classifier"
            inert = {"decode.inputs": why}
            examples = model.decodes_inputs and not self.decode.prompt  # num_samples eval examples decoded
            if self.decode.strategy.prints_one_list and not examples:
                kind = self.decode.strategy.kind
                inert["decode.num_samples"] = f"decode.strategy={kind!r} prints one n-best list of the prompt"
            return inert
        why = f"the model ({model.__name__}) does not sample text"
        inert = {"train.decode_interval_steps": why, "train.sample_at_end": why}
        if not model.decodes_examples:
            return {**inert, "decode": f"the model ({model.__name__}) does not decode"}
        reads = ("num_samples", "inputs")
        why = f"the model ({model.__name__}) decodes examples to records; it reads only decode.num_samples and inputs"
        return {**inert, **{f"decode.{f.name}": why for f in dataclasses.fields(self.decode) if f.name not in reads}}

    def validate(self, num_devices: int | None = None, data_files: bool = True, num_hosts: int | None = None) -> None:
        """Every constraint between its configs that can be checked before the run starts (each
        config checked its own fields once, when it was made); ConfigError names the field. The
        entry points call it once, before anything is written, and what they build after takes
        it as valid. num_devices: the
        devices the mesh must match (None: not checked); num_hosts: the processes whose per-host
        batches make the train and eval global batches, checked against the mesh (None: not
        checked; the dry run plans the train batch alone); data_files=False leaves the data files unread (the
        --dry-run planner)."""
        self.model.ensure_valid()  # the one config not checked when made (ModelConfig.validate)
        self.resolved_learner()  # the learner the run builds, its decay_end 0 filled in, validates
        if num_devices is not None:
            self.mesh.check_devices(num_devices)
        backend = jax.default_backend() if num_devices is not None else "gpu"  # devices known: the run's
        if self.profile.auto_pgle and backend != "gpu":
            raise ConfigError(
                f"profile.auto_pgle=True tunes XLA's GPU latency-hiding scheduler, and this run's devices "
                f"are {backend}: it would change nothing; remove --profile.auto-pgle."
            )
        self._check_pipeline_mesh()
        self._check_quantization()
        self._check_context_mesh()
        self.model.check_data(self.data)
        from pax_eqx.metric_fns import check_metric_names

        check_metric_names(self.data.eval.metrics, skipped=self.unfed_metrics())  # a skipped one needs no extra
        if self.train.sample_at_end and not self.model.decodes:
            raise ConfigError(
                f"train.sample_at_end=True, but the model ({type(self.model).__name__}) does not decode; "
                "pass --train.no-sample-at-end."
            )
        if self.train.decode_interval_steps and not self.model.decodes:
            raise ConfigError(
                f"train.decode_interval_steps={self.train.decode_interval_steps}, but the model "
                f"({type(self.model).__name__}) does not decode; leave it at 0."
            )
        micro = self.learner.num_microbatches
        if self.data.train.batch_size % micro:
            raise ConfigError(
                f"data.train.batch_size={self.data.train.batch_size} is not divisible by "
                f"learner.num_microbatches={micro}."
            )
        self.data.validate(files=data_files)
        if num_hosts is not None:
            _check_batch_divisible(self, num_hosts)

    def resolved_learner(self) -> LearnerConfig:
        """The learner this run trains with: `learner` with what it leaves to the run filled in
        (a decaying schedule's decay_end 0 becomes train.num_steps, or the step after the decay
        starts when the run ends before that: `ScheduleConfig.note_for_run` says so). `learner`
        itself keeps the 0, so `--train.num-steps` moves the decay's end and config.json stores
        what was chosen."""
        return self.learner.resolve(self.train.num_steps)

    def _check_context_mesh(self) -> None:
        """The context axis (a 5-entry mesh shape) splits each row's tokens: it must divide them, or
        the rules would leave the sequence whole and those devices would repeat each other's work;
        and attention must be a kernel that takes a split query sequence (XLA's, not cuDNN's)."""
        context = self.mesh.context
        if context > 1 and self.data.seq_len % context:
            raise ConfigError(
                f"mesh.ici_mesh_shape {self.mesh.ici_mesh_shape} x mesh.dcn_mesh_shape {self.mesh.dcn_mesh_shape} has "
                f"a context axis of {context}, which does not divide data.seq_len={self.data.seq_len}; choose a "
                f"sequence length that is a multiple of {context} or a context size that divides it."
            )
        attention = getattr(getattr(self.model, "block", None), "attention", None)
        if context > 1 and getattr(attention, "implementation", None) == "cudnn":
            raise ConfigError(
                f"model.block.attention.implementation='cudnn' with a context axis of {context}: cuDNN's fused "
                "attention takes no sharded query sequence (jax's partitioner of it refuses one); use "
                "--model.block.attention.implementation xla, or a mesh without a context axis."
            )

    def _check_quantization(self) -> None:
        """A quantized model is not pipelined and takes no LoRA adapters (a quantized weight is not
        a float one they could be merged into)."""
        choice = self.quantization
        if not choice.enabled:
            return
        pipeline = getattr(self.model, "pipeline", None)
        if pipeline is not None and pipeline.enabled:
            raise ConfigError(
                f"quantization {choice.kind} with a pipelined stack (model.pipeline.num_stages={pipeline.num_stages}): "
                "the stages' weights are re-laid per stage, which quantized weights do not follow; train unpipelined, "
                "or pass --quantization none."
            )
        if self.lora.enabled:
            raise ConfigError(
                f"quantization {choice.kind} with lora.targets={self.lora.targets!r}: LoRA adapts float weights; "
                "train the adapters in float (--quantization none) and quantize the merged model after."
            )

    def _check_pipeline_mesh(self) -> None:
        """The mesh's stage axis is the model's pipeline stages (or 1: every stage on each device)."""
        pipeline = getattr(self.model, "pipeline", None)
        stages = pipeline.num_stages if pipeline is not None else 1
        mesh_stages = self.mesh.num_stages
        if mesh_stages > 1 and stages == 1:
            raise ConfigError(
                f"mesh.ici_mesh_shape {self.mesh.ici_mesh_shape} x mesh.dcn_mesh_shape {self.mesh.dcn_mesh_shape} has "
                f"a stage axis of {mesh_stages}, but the model is not pipelined (model.pipeline.num_stages=1), so "
                f"those devices would repeat each other's work; set --model.pipeline.num-stages {mesh_stages} or "
                "give 3-entry (data, fsdp, tensor) mesh shapes."
            )
        if mesh_stages > 1 and mesh_stages != stages:
            raise ConfigError(
                f"model.pipeline.num_stages={stages} but the mesh's stage axis is {mesh_stages} (mesh.ici_mesh_shape"
                f" {self.mesh.ici_mesh_shape} x mesh.dcn_mesh_shape {self.mesh.dcn_mesh_shape}); make them equal."
            )


def _check_batch_divisible(exp: ExperimentConfig, num_hosts: int) -> None:
    """The global batch (per-host batch x hosts, per microbatch) must split over the mesh's
    batch axes (data x fsdp by the default rules)."""
    mesh = dict(zip(AXES, exp.mesh.shape))
    divisor = math.prod(mesh[a] for a in parse_rules(exp.mesh.rules)["batch"])
    for split in ("train", "eval"):
        per_host = getattr(exp.data, split).batch_size
        micro = exp.learner.num_microbatches if split == "train" else 1
        global_batch = per_host * num_hosts // micro
        if global_batch % divisor:
            raise ConfigError(
                f"data.{split}.batch_size={per_host} x {num_hosts} host(s)"
                + (f" / learner.num_microbatches={micro}" if micro > 1 else "")
                + f" = {global_batch} is not divisible by the mesh's data x fsdp = {divisor}; "
                "change the batch size or the mesh shape."
            )
        pipeline = getattr(exp.model, "pipeline", None)
        inner = divisor // exp.mesh.num_stages  # a microbatch's rows split over data x fsdp only
        if pipeline is not None and pipeline.enabled and global_batch % (pipeline.num_microbatches * inner):
            raise ConfigError(
                f"data.{split}.batch_size={per_host} x {num_hosts} host(s)"
                + (f" / learner.num_microbatches={micro}" if micro > 1 else "")
                + f" = {global_batch} does not split into model.pipeline.num_microbatches={pipeline.num_microbatches}"
                f" microbatches of a multiple of the mesh's data x fsdp = {inner} rows; change the batch size or "
                "num_microbatches."
            )
