"""ExperimentConfig: one frozen config that says everything about a run (Pax's experiment class).

Pax experiments are classes whose constants (NUM_LAYERS, ICI_MESH_SHAPE, ...) and `task()` /
`datasets()` methods define a run. Here an experiment is a value of this dataclass: named
experiments in `experiments/` are functions returning one, the CLI overrides any nested field
(`--model.num-layers 4`), and the resolved value is written to `DIR/config.json`.

`validate()` checks every cross-field constraint up front -- mesh vs devices, batch vs mesh,
eval table, sequence length vs model -- so bad combinations fail before anything is written.
"""

from __future__ import annotations

from typing import Literal

from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.config import Config, ConfigError, config
from pax_eqx.data import DataConfig, is_seq2seq, target_length
from pax_eqx.learners import LearnerConfig
from pax_eqx.models.decoding import SampleConfig
from pax_eqx.models.language_model import LanguageModelConfig
from pax_eqx.models.model import ModelConfig
from pax_eqx.models.sequence_model import SequenceModelConfig
from pax_eqx.sharding.mesh import MeshConfig
from pax_eqx.task_config import TaskConfig


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
    """

    num_steps: int = 1000
    eval_interval_steps: int = 100
    summary_interval_steps: int = 10
    seed: int = 1234
    fprop_dtype: Literal["float32", "bfloat16"] = "float32"
    sample_at_end: bool = True
    layer_summaries: bool = False


@config
class DecodeConfig(SampleConfig):
    """prompt: text to continue; seed: sampling seed; num_samples: continuations to print."""

    prompt: str = "ROMEO:"
    seed: int = 0
    num_samples: int = 1


@config
class ProfileConfig(Config):
    """steps: (first, last) training steps to trace with the JAX profiler into DIR/profile/; () = off.
    auto_pgle: turn on XLA's automatic profile-guided latency estimation (GPU)."""

    steps: tuple[int, ...] = ()
    auto_pgle: bool = False


@config
class ExperimentConfig(Config):
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

    def validate(self, num_devices: int | None = None, data_files: bool = True) -> None:
        """Every constraint that can be checked before the run starts; ValueError names the field.
        data_files=False leaves the data files unread (the --dry-run planner)."""
        if self.train.num_steps <= 0:
            raise ConfigError(
                f"train.num_steps must be > 0 (the step a run trains up to), got {self.train.num_steps}; "
                "pass e.g. --train.num-steps 1000."
            )
        for name in ("eval_interval_steps", "summary_interval_steps"):
            if getattr(self.train, name) < 0:
                flag = "--train." + name.replace("_", "-")
                raise ConfigError(
                    f"train.{name} must be >= 0 (0 = only at the end), got {getattr(self.train, name)}; "
                    f"pass e.g. {flag} 100."
                )
        self.model.validate()
        self.mesh.validate(num_devices)
        if isinstance(self.model, LanguageModelConfig | SequenceModelConfig):
            self._check_sequence_data()
        if self.train.sample_at_end and not self.model.decodes:
            raise ConfigError(
                f"train.sample_at_end=True, but the model ({type(self.model).__name__}) does not decode; "
                "pass --train.no-sample-at-end."
            )
        micro = self.learner.num_microbatches
        if self.data.train.batch_size % micro:
            raise ConfigError(
                f"data.train.batch_size={self.data.train.batch_size} is not divisible by "
                f"learner.num_microbatches={micro}."
            )
        if self.profile.steps and (len(self.profile.steps) != 2 or self.profile.steps[0] > self.profile.steps[1]):
            raise ConfigError(f"profile.steps must be (first, last) with first <= last, got {self.profile.steps}.")
        self.data.validate(files=data_files)

    def _check_sequence_data(self) -> None:
        """A token model's data: the right kind (LM rows or seq2seq pairs), lengths that fit."""
        seq2seq = isinstance(self.model, SequenceModelConfig)
        if seq2seq != is_seq2seq(self.data):
            want = (
                "a sequence-to-sequence layout (data.layout='span_corruption' or data.source='seq2seq_jsonl')"
                if seq2seq
                else "language-model rows (data.layout 'stream' or 'packed', not span_corruption or seq2seq_jsonl)"
            )
            raise ConfigError(
                f"model is a {type(self.model).__name__}, which trains on {want}; data.source={self.data.source!r} "
                f"with data.layout={self.data.layout!r} gives the other kind. Change the data or the model."
            )
        lengths = {"data.seq_len": self.data.seq_len}
        if seq2seq:
            lengths["data.target_seq_len (as resolved)"] = target_length(self.data)
        for name, length in lengths.items():
            if length > self.model.max_seq_len:
                raise ConfigError(
                    f"{name}={length} is longer than model.max_seq_len={self.model.max_seq_len}; "
                    f"lower {name.split(' ')[0]} or raise model.max_seq_len."
                )


def check_batch_divisible(exp: ExperimentConfig, num_hosts: int, divisor: int) -> None:
    """The global batch (per-host batch x hosts, per microbatch) must split over data x fsdp."""
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
