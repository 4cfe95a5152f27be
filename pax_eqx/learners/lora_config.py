"""LoraConfig: low-rank adapters on chosen weights of a trained model (`ExperimentConfig.lora`).

    --lora.targets '.*attention\\.w_[qv]' --lora.rank 8 --lora.alpha 16 --lora.base-job-dir runs/llama
    --lora.dropout 0.05

LoRA (Hu et al. 2021) trains, for each chosen weight W [in, out], two small matrices A [in, r]
and B [r, out] and computes with W + (alpha / r) A @ B. The base W stays frozen: it gets no
gradient and no optimizer state, and the checkpoints of a LoRA run hold only A and B (their
optimizer state, the step) and a reference to the base job dir. B starts at zero, so step 0
computes exactly what the base computes. With `dropout` p > 0 the training forward computes, as
PEFT's lora_dropout, x @ W + (alpha / r) dropout_p(x) @ A @ B: a fresh mask on the adapter's input
every step, none in eval, decode and export (`pax_eqx/layers/low_rank.py`).

Off by default: `targets` empty. Then the other fields are read by nothing, and a flag that
sets one is refused (`inert_fields`).
"""

from __future__ import annotations

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.learners.variables import check_patterns

_WHERE = "lora"


@config
class LoraConfig(Config):
    """targets: regexes on parameter names (`pax_eqx.learners.variables`: the whole name, e.g.
        "stack\\.layers\\.attention\\.w_[qv]" or "stack\\.layers\\.ff_.*\\.w"); each weight a pattern
        chooses gets an adapter. () = LoRA off (every weight trains, as usual).
    rank: r, the adapters' inner width (A [in, r], B [r, out]).
    alpha: the adapters' scale is alpha / rank (PEFT's lora_alpha).
    base_job_dir: the job dir whose checkpoint is the frozen base (one import_hf or train wrote);
        its config.json must describe the same model.
    base_step: the base checkpoint's step (-1 = its newest when this run starts; recorded, so a
        resumed run reads the same one).
    dropout: p of the dropout on each adapter's input in training (PEFT's lora_dropout); 0 = none.
        Adapters on an embedding ([vocab, embed], looked up, not multiplied) take none, as PEFT's.
    """

    targets: tuple[str, ...] = ()
    rank: int = 8
    alpha: float = 16.0
    base_job_dir: str = ""
    base_step: int = -1
    dropout: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def enabled(self) -> bool:
        return bool(self.targets)

    @property
    def scale(self) -> float:
        """alpha / rank: what multiplies A @ B."""
        return self.alpha / self.rank

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "rank", gt=0, prefix=_WHERE, note="the adapters' inner width", fix="Pass e.g. --lora.rank 8.")
        check_range(
            self, "alpha", gt=0, prefix=_WHERE, note="the scale is alpha / rank", fix="Pass e.g. --lora.alpha 16."
        )
        check_range(self, "base_step", ge=-1, prefix=_WHERE, note="-1 = the newest")
        check_range(
            self, "dropout", ge=0.0, lt=1.0, prefix=_WHERE, note="a probability; 0 = none",
            fix="Pass e.g. --lora.dropout 0.05.",
        )  # fmt: skip
        check_patterns(f"{_WHERE}.targets", self.targets)
        if self.enabled and not self.base_job_dir:
            raise ConfigError(
                f"{_WHERE}.targets={self.targets!r} with no {_WHERE}.base_job_dir: LoRA adapts a trained model, whose "
                "checkpoint stays frozen; name its job dir (e.g. --lora.base-job-dir runs/llama, one import_hf wrote)."
            )

    def inert_fields(self) -> dict[str, str]:
        if self.enabled:
            return {}
        why = "LoRA is off (lora.targets is empty); set --lora.targets to choose the weights that get adapters"
        return {name: why for name in ("rank", "alpha", "base_job_dir", "base_step", "dropout")}
