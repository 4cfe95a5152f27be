"""Encoder-decoder experiments: span corruption on Shakespeare (CPU, minutes), and T5 1.1.

shakespeare_span_corruption: a small T5 1.1-style encoder-decoder (2 + 2 layers, 128 dims,
gated GELU, RMSNorm, no biases, T5's relative position bias, untied softmax) trained with T5's
span-corruption objective on the plays, byte-level: each input is 128 bytes of corrupted text
(141 raw bytes, 15% of them dropped in spans of mean length 3, each span replaced by a sentinel);
the target is the sentinels followed by the spans they hide (29 tokens). The vocabulary is the
byte tokenizer's 260 plus the 7 sentinels an input can hold, padded to 272. At the end of
training it prints corrupted eval inputs with their greedy and beam-search reconstructions.

t5_1_1_{small,base,large,xl,xxl}: T5 1.1 (t5x/examples/t5/t5_1_1/*.gin) at its exact sizes with
T5X's C4 pretraining recipe (t5_1_1/examples/*_c4_pretrain.gin, configs/runs/pretrain.gin):
inputs 512 / targets 114 (span corruption, 568 raw tokens), batch 256, Adafactor (decay 0.8,
update clipping 1, parameter-scaled) at 1/sqrt(max(step, 10000)), dropout 0, 32128 vocabulary
(SentencePiece 32000 + sentinels), bf16 activations. C4 is local JSON-lines files (--data.path);
`--dry-run` plans them without data. Differences from T5X, all in the init or the loss: kernels
start Gaussian(d_model^-0.5) rather than fan-in truncated normal, the 1/sqrt(d_kv) logit scale is
applied in attention rather than folded into the query init, and there is no z-loss (1e-4 in T5X).
Step counts: the example gins train small 10k and base 100k steps; large, xl and xxl have no
example gin and take base's 100k.
"""

from __future__ import annotations

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import (
    ByteTokenizerConfig,
    DataConfig,
    InputConfig,
    JsonlSource,
    SentencePieceConfig,
    ShakespeareSource,
)
from pax_eqx.experiment import DecodeConfig, ExperimentConfig, TrainConfig
from pax_eqx.layers import ActivationConfig, AttentionConfig, RmsNormConfig, TransformerConfig
from pax_eqx.layers.initializers import gaussian
from pax_eqx.learners import AdafactorConfig, AdamWConfig, CosineSchedule, LearnerConfig, RsqrtSchedule
from pax_eqx.models import BeamStrategy
from pax_eqx.models.sequence_model import SequenceModelConfig

# T5 1.1's layer: pre-RMSNorm (eps 1e-6), gated GELU, no biases anywhere.
_T5_NORM = RmsNormConfig(epsilon=1e-6)
_T5_BLOCK = TransformerConfig(
    norm_policy="pre",
    norm=_T5_NORM,
    attention=AttentionConfig(use_bias=False),
    activation=ActivationConfig(name="gelu", gated=True),
    ff_has_bias=False,
)


@register("shakespeare_span_corruption", aliases=("ShakespeareSpanCorruption",))
def shakespeare_span_corruption() -> ExperimentConfig:
    """A small byte-level T5 trained with span corruption on Shakespeare's plays; minutes on a CPU."""
    return ExperimentConfig(
        name="shakespeare_span_corruption",
        model=SequenceModelConfig(
            vocab_size=272,
            max_seq_len=128,
            num_encoder_layers=2,
            num_decoder_layers=2,
            model_dims=128,
            hidden_dims=384,
            num_heads=4,
            block=_T5_BLOCK,
            final_norm=_T5_NORM,
            separate_embedding=True,
            embedding_init=gaussian(1.0),
            init=gaussian(128**-0.5),
        ),
        learner=LearnerConfig(
            optimizer=AdamWConfig(b1=0.9, b2=0.99),
            learning_rate=3e-3,
            weight_decay=0.01,
            clip_grad_norm=1.0,
            schedule=CosineSchedule(warmup_steps=100, decay_end=0, min_ratio=0.1),  # decays until train.num_steps
        ),
        data=DataConfig(
            source=ShakespeareSource(layout="span_corruption"),
            seq_len=128,
            tokenizer=ByteTokenizerConfig(),
            train=InputConfig(batch_size=16),
            eval=InputConfig(
                batch_size=16,
                shuffle=False,
                repeat=True,
                reset_for_eval=False,
                eval_loop_num_batches=20,
                metrics=("exact_match", "bleu"),
            ),  # fmt: skip
        ),
        train=TrainConfig(num_steps=1500, eval_interval_steps=500, summary_interval_steps=50),
        checkpoint=CheckpointConfig(every_n_steps=500, max_to_keep=3),
        decode=DecodeConfig(prompt="", max_new_tokens=32, strategy=BeamStrategy(beam_size=4), num_samples=4),
    )


def _t5_1_1(name: str, *, dims: int, hidden: int, heads: int, layers: int, steps: int) -> ExperimentConfig:
    """T5 1.1 at one size (t5_1_1/<size>.gin) with T5X's C4 span-corruption pretraining recipe."""
    return ExperimentConfig(
        name=name,
        model=SequenceModelConfig(
            vocab_size=32128,
            max_seq_len=512,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            model_dims=dims,
            hidden_dims=hidden,
            num_heads=heads,
            dim_per_head=64,
            block=_T5_BLOCK,
            final_norm=_T5_NORM,
            separate_embedding=True,
            embedding_init=gaussian(1.0),
            init=gaussian(dims**-0.5),
            remat_policy="dots_with_no_batch_dims_saveable",
        ),
        learner=LearnerConfig(
            optimizer=AdafactorConfig(),
            learning_rate=0.01,  # x sqrt(10000 / step) from step 10000: 1 / sqrt(max(step, 10000))
            schedule=RsqrtSchedule(decay_start=10_000),
        ),
        data=DataConfig(
            source=JsonlSource(jsonl_text_key="text", layout="span_corruption"),
            seq_len=512,
            tokenizer=SentencePieceConfig(vocab_size=32000),
            train=InputConfig(batch_size=256),
            eval=InputConfig(batch_size=256, shuffle=False, repeat=False, reset_for_eval=True),
        ),
        train=TrainConfig(
            num_steps=steps, eval_interval_steps=1000, summary_interval_steps=100, fprop_dtype="bfloat16"
        ),
        checkpoint=CheckpointConfig(every_n_steps=1000, max_to_keep=3),
        decode=DecodeConfig(prompt="", max_new_tokens=114, strategy=BeamStrategy(beam_size=4), num_samples=4),
    )


@register("t5_1_1_small", aliases=("T5_1_1_Small",))
def t5_1_1_small() -> ExperimentConfig:
    """T5 1.1 small (77M): 8+8 layers, d_model 512, d_ff 1024, 6 heads of 64; C4 span corruption."""
    return _t5_1_1("t5_1_1_small", dims=512, hidden=1024, heads=6, layers=8, steps=10_000)


@register("t5_1_1_base", aliases=("T5_1_1_Base",))
def t5_1_1_base() -> ExperimentConfig:
    """T5 1.1 base (250M): 12+12 layers, d_model 768, d_ff 2048, 12 heads of 64; C4 span corruption."""
    return _t5_1_1("t5_1_1_base", dims=768, hidden=2048, heads=12, layers=12, steps=100_000)


@register("t5_1_1_large", aliases=("T5_1_1_Large",))
def t5_1_1_large() -> ExperimentConfig:
    """T5 1.1 large (800M): 24+24 layers, d_model 1024, d_ff 2816, 16 heads of 64; C4 span corruption."""
    return _t5_1_1("t5_1_1_large", dims=1024, hidden=2816, heads=16, layers=24, steps=100_000)


@register("t5_1_1_xl", aliases=("T5_1_1_XL",))
def t5_1_1_xl() -> ExperimentConfig:
    """T5 1.1 XL (3B): 24+24 layers, d_model 2048, d_ff 5120, 32 heads of 64; C4 span corruption."""
    return _t5_1_1("t5_1_1_xl", dims=2048, hidden=5120, heads=32, layers=24, steps=100_000)


@register("t5_1_1_xxl", aliases=("T5_1_1_XXL",))
def t5_1_1_xxl() -> ExperimentConfig:
    """T5 1.1 XXL (11B): 24+24 layers, d_model 4096, d_ff 10240, 64 heads of 64; C4 span corruption."""
    return _t5_1_1("t5_1_1_xxl", dims=4096, hidden=10240, heads=64, layers=24, steps=100_000)
