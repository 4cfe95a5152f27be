"""BERT masked language models: a tiny one on Shakespeare, and Paxml's six (paxml/tasks/lm/params/bert.py).

`bert_shakespeare_char` is the default experiment's recipe (experiments/shakespeare.py: 4 layers,
d 128, 4 heads, bytes, rotary positions, AdamW with cosine decay, the same text and eval windows)
as a bidirectional masked LM (models.bert_model): 15% of the bytes chosen, 80% of those shown as
the mask id 260 (one id past the byte tokenizer's 260), 10% as a random id, 10% as themselves, and
the loss and accuracy taken at the chosen bytes. `python -m benchmarks.bert_learning` trains it for
a few hundred steps and compares its masked-byte accuracy with always guessing the most frequent
byte. Decoding fills masks: `python -m pax_eqx.decode --job-log-dir DIR --prompt "ROMEO: But
soft, what l[MASK]ght through yonder w[MASK]ndow breaks?"`.

Paxml's six, each registered under its snake_case name, its class name and
`tasks.lm.params.bert.<Class>`, with Paxml 1.4's numbers (the class constants resolved through
BertDataset, model_params.TransformerBertPmapAdam / TransformerBertSpmdAdafactor and each
`task()`); `BERT_*` below are `PaxLm` values (experiments/lm_cloud.py: one field per class
constant) made into BERT by `_bert`:

- the TransformerLm is BIDIRECTIONAL and packed, so attention has no causal mask and padding is
  folded into the segment mask (`mask_mode="praxis"`, as Praxis' TransformerLm always does);
  Praxis' defaults elsewhere: sinusoidal positions (PositionalEmbedding), LayerNorm eps 1e-6 with
  `1 + scale`, PerDimScale, Xavier(1.000001) projections, feed-forward biases, no attention
  biases, attention logits capped at 50; the shared softmax scaled by sqrt(d) with its bias,
  logits capped at 30, initialised Gaussian(1 / sqrt(d)); ReLU, no gated activation, no dropout;
- BertAdamL4H128 (TransformerBertPmapAdam): separate q/k/v, Praxis Adam (model_params.
  set_default_adam: beta2 0.99, eps 1e-6, update RMS cap 1, clip 5, weight decay on every
  parameter) with LinearRampupExponentialDecay(4000, 4001, DECAY_END=300000, 0.1, 1.0); it is a
  pmap experiment, data-parallel over every local device: Pax's docstring counts a JF 2x2 (8
  cores), so the mesh here is (8, 1, 1) (our `data` axis only splits the batch) and the global
  batch 8 x 8 = 64;
- the BertSpmd ones (TransformerBertSpmdAdafactor): combined QKV, the model's MASK_TOKEN_ID 0,
  Praxis ShardedAdafactor (set_default_adafactor: decay_method adam, decay_adam 0.99, beta1 0.9,
  no parameter scaling, the last two dims factored, update RMS cap 1, the momentum in int8 as
  Praxis' default quantized_dtype, clip 5, weight decay on every parameter) with
  LinearRampupExponentialDecay(4000, 4001, DECAY_END=100000, 0.1, 1.0);
  MESH_SHAPE [replica, data, mdl] is our (data, fsdp, tensor) ICI shape, and the global batch
  PERCORE_BATCH_SIZE x its devices; the L33 / L66 ones smooth the labels by 0.1;
- none repeats its layers, so CHECKPOINT_POLICY (SAVE_DOT_WITH_NO_BATCH_DIM,
  SAVE_DOT_FOR_MLPERF_200B) remats nothing, in Pax as here; sequences are MLPerf BERT's 512
  (TFRecordBertInput.max_sequence_length); checkpoints, summaries and evals every Pax's
  CHECKPOINT_EVERY_N_STEPS / 100 / 100 steps, 1e7 steps (Pax's defaults).

What pax_eqx does differently, and why:

- Data. Pax reads MLPerf BERT's Wikipedia TFRecords (WordPiece ids, vocabulary 30522), packed,
  re-masked on the fly by its input pipeline (remask, mask id 103), and pre-masked eval records;
  the model's own augmenter never runs (FORCE_MASK_GENERATION False and `masked_ids` present).
  Neither the TFRecords nor their vocabulary can be had here, so, as experiments/c4.py does, the
  experiments read local JSON-lines text (`--data.path`, refused in one line when absent) with a
  SentencePiece vocabulary of the model's 32000 ids trained into the job dir (or a prepared
  corpus, `--data.source array_record`), packed into 512-token rows, and the model masks its own
  input with its MASK_TOKEN_ID 0 (pad: never a real token here) by Praxis' augmenter's numbers
  (12% / 1.5% / 1.5%), as Praxis' BertModel does without pre-masked data. A batch that carries
  `masked_ids` / `masked_pos` (a source of one's own) is used as given, as in Pax.
  `--data.source synthetic` trains on Pax's synthetic rows.
- Label smoothing (L33 / L66): optax's form, (1 - 0.1) one-hot + 0.1 / V, where Praxis puts
  0.1 / (V - 1) on each wrong class (docs/design.md, "Praxis conventions"): 0.9 + 3e-6 on the
  right token instead of 0.9.
- Adafactor's momentum averages the updates before the learning rate (equal to Praxis' at a
  constant rate; docs/design.md), and the attention init is pax_eqx's (experiments/lm_cloud.py).
"""

from __future__ import annotations

import dataclasses

from experiments.lm_cloud import PaxLm, pax_names, set_default_adam
from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import ByteTokenizerConfig, DataConfig, InputConfig, ShakespeareSource
from pax_eqx.experiment import DecodeConfig, ExperimentConfig, TrainConfig
from pax_eqx.layers import ActivationConfig, AttentionConfig, LayerNormConfig, TransformerConfig
from pax_eqx.learners import (
    AdafactorConfig,
    AdamWConfig,
    CosineSchedule,
    LearnerConfig,
    linear_rampup_exponential_decay,
)
from pax_eqx.models import BertModelConfig, LanguageModelConfig

BERT_PROMPT = "ROMEO: But soft, what l[MASK]ght through yonder w[MASK]ndow breaks?"


@register("bert_shakespeare_char", aliases=("BertShakespeareChar",))
def bert_shakespeare_char() -> ExperimentConfig:
    """A byte-level BERT on Shakespeare's plays: shakespeare_char's model and recipe, bidirectional,
    trained to fill 15% of the bytes; minutes on a laptop."""
    norm = LayerNormConfig(epsilon=1e-5, use_bias=False)
    block = TransformerConfig(
        norm_policy="pre",
        norm=norm,
        attention=AttentionConfig(causal=False, combine_qkv=True, use_bias=False),
        activation=ActivationConfig(name="gelu_exact"),
        ff_has_bias=False,
    )
    return ExperimentConfig(
        name="bert_shakespeare_char",
        model=BertModelConfig(
            vocab_size=261,  # the byte tokenizer's 260 ids and the mask
            mask_token_id=260,
            max_seq_len=64,
            num_layers=4,
            model_dims=128,
            hidden_dims=512,
            num_heads=4,
            position_embedding="rotary",
            block=block,
            final_norm=norm,
            repeat=False,
        ),
        learner=LearnerConfig(
            optimizer=AdamWConfig(b1=0.9, b2=0.99),
            learning_rate=2e-3,
            weight_decay=0.1,
            clip_grad_norm=1.0,
            schedule=CosineSchedule(warmup_steps=100, decay_end=0, min_ratio=0.1),  # decays until train.num_steps
        ),
        data=DataConfig(
            source=ShakespeareSource(layout="stream"),
            seq_len=64,
            tokenizer=ByteTokenizerConfig(),
            train=InputConfig(batch_size=12),
            eval=InputConfig(batch_size=12, shuffle=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=50),
        ),
        train=TrainConfig(num_steps=2000, eval_interval_steps=500, summary_interval_steps=50, steps_per_loop=10),
        checkpoint=CheckpointConfig(every_n_steps=500, max_to_keep=3),
        decode=DecodeConfig(prompt=BERT_PROMPT),
    )


def set_default_adafactor(learning_rate: float, weight_decay: float, *, decay_end: int = 100_000) -> LearnerConfig:
    """model_params.set_default_adafactor: Praxis ShardedAdafactor(decay_method='adam', beta1=0.9,
    decay_adam=0.99, weight_decay; its default quantized_dtype='int8'), clip 5.0,
    lr x LinearRampupExponentialDecay(4000, 4001, decay_end, 0.1, 1.0)."""
    return LearnerConfig(
        optimizer=AdafactorConfig(
            decay_method="adam",
            decay_rate=0.99,
            beta1=0.9,
            multiply_by_parameter_scale=False,
            factored_dims="last",
            momentum_dtype="int8",
        ),
        learning_rate=learning_rate,
        schedule=linear_rampup_exponential_decay(
            warmup_steps=4000, decay_start=4001, decay_end=decay_end, min_ratio=0.1, max=1.0
        ),
        weight_decay=weight_decay,
        weight_decay_mask="all",
        clip_grad_norm=5.0,
        skip_nonfinite=True,
    )


def _bert(spec: PaxLm, name: str, *, mask_token_id: int = 0, label_smoothing_prob: float = 0.0) -> ExperimentConfig:
    """The PaxLm experiment as a BERT: a bidirectional TransformerLm, the model masking its input."""
    exp = spec.experiment(name)
    lm: LanguageModelConfig = exp.model
    fields = {f.name: getattr(lm, f.name) for f in dataclasses.fields(LanguageModelConfig)}
    fields["block"] = lm.block.replace(attention=lm.block.attention.replace(causal=False))
    model = BertModelConfig(**fields, mask_token_id=mask_token_id).replace(label_smoothing_prob=label_smoothing_prob)
    data = exp.data.replace(eval=exp.data.eval.replace(metrics=()))  # bits per byte reads next-token labels
    return exp.replace(model=model, data=data, decode=DecodeConfig(prompt="The [MASK] of the [MASK]."))


# BertDataset + model_params.TransformerBertPmapAdam, BertAdamL4H128's constants.
BERT_ADAM_L4H128 = PaxLm(
    num_layers=4,
    model_dims=128,
    hidden_dims=512,
    num_heads=8,
    dims_per_head=0,
    vocab_size=32000,
    max_seq_len=512,
    percore_batch_size=8,
    ici_mesh_shape=(8, 1, 1),  # pmap over a JF 2x2's 8 cores: "global batch size = 2 * 2 * 2 * 8 = 64"
    fprop_dtype="bfloat16",
    use_repeated_layer=False,
    checkpoint_policy="SAVE_DOT_WITH_NO_BATCH_DIM",  # inert: the layers are not repeated
    activation="relu",
    combine_qkv=False,
    learner=set_default_adam(1e-3, 1e-3, decay_end=300_000),
    checkpoint_every_n_steps=5000,
    data="c4",
)

# BertDataset + model_params.TransformerBertSpmdAdafactor + bert.BertSpmd.
BERT_SPMD = PaxLm(
    num_layers=32,
    model_dims=1024,
    hidden_dims=4096,
    num_heads=16,
    dims_per_head=0,
    vocab_size=32000,
    max_seq_len=512,
    percore_batch_size=8,
    fprop_dtype="float32",
    use_repeated_layer=False,
    checkpoint_policy="SAVE_DOT_WITH_NO_BATCH_DIM",  # inert: the layers are not repeated
    activation="relu",
    combine_qkv=True,
    learner=set_default_adafactor(1e-3, 1e-3, decay_end=100_000),
    checkpoint_every_n_steps=500,
    checkpoint_max_to_keep=10,
    data="c4",
)
BERT_SPMD_L4H128 = BERT_SPMD.replace(
    num_layers=4, model_dims=128, hidden_dims=512, num_heads=8, percore_batch_size=4, ici_mesh_shape=(1, 4, 2),
    fprop_dtype="bfloat16", learner=set_default_adafactor(2.5e-4, 1e-3), checkpoint_every_n_steps=5000,
)  # fmt: skip
BERT_SPMD_L33H12K_BIGGER_BATCH = BERT_SPMD.replace(
    num_layers=33, model_dims=12288, hidden_dims=12288 * 8, num_heads=128, percore_batch_size=4,
    ici_mesh_shape=(1, 64, 8), fprop_dtype="bfloat16", learner=set_default_adafactor(2.5e-4, 1e-2),
    checkpoint_every_n_steps=1000,
)  # fmt: skip
BERT_SPMD_L33H12K_BIGGER_BATCH_8X8X16 = BERT_SPMD_L33H12K_BIGGER_BATCH.replace(
    ici_mesh_shape=(1, 64, 16), checkpoint_every_n_steps=500
)
BERT_SPMD_L66H12K_BIGGER_BATCH_8X8X16 = BERT_SPMD_L33H12K_BIGGER_BATCH.replace(
    num_layers=66, ici_mesh_shape=(1, 64, 16), checkpoint_policy="SAVE_DOT_FOR_MLPERF_200B",
    checkpoint_every_n_steps=200, checkpoint_max_to_keep=20,
)  # fmt: skip
BERT_SPMD_L66H12K_BIGGER_BATCH_8X8X8 = BERT_SPMD_L66H12K_BIGGER_BATCH_8X8X16.replace(
    percore_batch_size=1, ici_mesh_shape=(1, 64, 8)
)


@register("bert_adam_l4h128", aliases=pax_names("bert", "BertAdamL4H128"))
def bert_adam_l4h128() -> ExperimentConfig:
    """4 layers, d 128, 8 heads of 16, Praxis Adam, per-core batch 8 over 8 cores: global batch 64."""
    return _bert(BERT_ADAM_L4H128, "bert_adam_l4h128")


@register("bert_spmd_l4h128", aliases=pax_names("bert", "BertSpmdL4H128"))
def bert_spmd_l4h128() -> ExperimentConfig:
    """4 layers, d 128, 8 heads of 16, Adafactor, per-core batch 4 on ICI (1, 4, 2): global batch 32."""
    return _bert(BERT_SPMD_L4H128, "bert_spmd_l4h128")


@register("bert_spmd_l33h12k_bigger_batch", aliases=pax_names("bert", "BertSpmdL33H12kBiggerBatch"))
def bert_spmd_l33h12k_bigger_batch() -> ExperimentConfig:
    """100B: 33 layers, d 12288, 128 heads of 96, hidden 98304, label smoothing 0.1, per-core 4 on
    ICI (1, 64, 8): global batch 2048."""
    return _bert(BERT_SPMD_L33H12K_BIGGER_BATCH, "bert_spmd_l33h12k_bigger_batch", label_smoothing_prob=0.1)


@register("bert_spmd_l33h12k_bigger_batch_8x8x16", aliases=pax_names("bert", "BertSpmdL33H12kBiggerBatch8x8x16"))
def bert_spmd_l33h12k_bigger_batch_8x8x16() -> ExperimentConfig:
    """The 100B on ICI (1, 64, 16): global batch 4096."""
    return _bert(
        BERT_SPMD_L33H12K_BIGGER_BATCH_8X8X16, "bert_spmd_l33h12k_bigger_batch_8x8x16", label_smoothing_prob=0.1
    )


@register("bert_spmd_l66h12k_bigger_batch_8x8x16", aliases=pax_names("bert", "BertSpmdL66H12kBiggerBatch8x8x16"))
def bert_spmd_l66h12k_bigger_batch_8x8x16() -> ExperimentConfig:
    """200B: the 100B with 66 layers, on ICI (1, 64, 16): global batch 4096."""
    return _bert(
        BERT_SPMD_L66H12K_BIGGER_BATCH_8X8X16, "bert_spmd_l66h12k_bigger_batch_8x8x16", label_smoothing_prob=0.1
    )


@register("bert_spmd_l66h12k_bigger_batch_8x8x8", aliases=pax_names("bert", "BertSpmdL66H12kBiggerBatch8x8x8"))
def bert_spmd_l66h12k_bigger_batch_8x8x8() -> ExperimentConfig:
    """The 200B with per-core batch 1 on ICI (1, 64, 8): global batch 512."""
    return _bert(BERT_SPMD_L66H12K_BIGGER_BATCH_8X8X8, "bert_spmd_l66h12k_bigger_batch_8x8x8", label_smoothing_prob=0.1)
