"""gpt3_xl: the GPT-3 XL shape on one accelerator, the MFU benchmark's model.

24 layers, d_model 2048, 16 heads of 128, MLP 8192, sequence 2048, vocabulary 50304 (GPT-2's
50257 padded to a multiple of 64): 1.316B parameters. The architecture is the GPT-2/GPT-3 one
that `benchmarks/reference_gpt.py` writes by hand, so the two can be timed against each other:
pre-LayerNorm (eps 1e-5) with biases, fused QKV with biases, GELU (tanh form, as GPT-2), learned positions, tied
embedding/softmax, bf16 compute over float32 master weights, layers scanned with remat policy
`dots_with_no_batch_dims_saveable`, AdamW (0.9, 0.95, eps 1e-8, wd 0.1, clip 1.0), batch 16.

No Pax class has this shape: Pax's "GPT-3 XL" (`C4SpmdPipelineGpt3SmallAdam8Replicas`) takes
d_model = 24 x 128 = 3072 and is a 2.9B model (docs/pax_experiment_numbers.md, section 6).

Data: synthetic tokens by default (there is no GPT-2-tokenized corpus on these machines). A corpus
prepared once with `python -m pax_eqx.prepare_data` (docs/data.md, "Preparing a corpus"), e.g.
with GPT-2's tokenizer.json, trains with `--data.source array_record --data.path DIR
--data.tokenizer tokenizer_json --data.tokenizer.path tokenizer.json --data.tokenizer.eos-token
'<|endoftext|>'` (the manifest must name that tokenizer); documents are packed into rows of 2048
with segment ids (layout "packed", which the synthetic rows do not read). Your own text without
preparing it: `--data.source text_files --data.path ...`.
"""

from __future__ import annotations

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import DataConfig, InputConfig, SyntheticSource
from pax_eqx.experiment import ExperimentConfig, TrainConfig
from pax_eqx.layers import ActivationConfig, AttentionConfig, LayerNormConfig, TransformerConfig
from pax_eqx.learners import AdamWConfig, CosineSchedule, LearnerConfig
from pax_eqx.models import LanguageModelConfig


@register("gpt3_xl", aliases=("Gpt3XL",))
def gpt3_xl() -> ExperimentConfig:
    """GPT-3 XL (1.3B), bf16, scanned layers + remat, batch 16 x 2048 on one device."""
    norm = LayerNormConfig(epsilon=1e-5, use_bias=True)
    block = TransformerConfig(
        norm_policy="pre",
        norm=norm,
        attention=AttentionConfig(combine_qkv=True, use_bias=True),
        activation=ActivationConfig(name="gelu"),
        ff_has_bias=True,
    )
    return ExperimentConfig(
        name="gpt3_xl",
        model=LanguageModelConfig(
            vocab_size=50304,
            max_seq_len=2048,
            num_layers=24,
            model_dims=2048,
            hidden_dims=8192,
            num_heads=16,
            position_embedding="trainable",
            repeat=True,
            remat_policy="dots_with_no_batch_dims_saveable",
            block=block,
            final_norm=norm,
        ),
        learner=LearnerConfig(
            optimizer=AdamWConfig(b1=0.9, b2=0.95, eps=1e-8),
            learning_rate=2e-4,
            weight_decay=0.1,
            clip_grad_norm=1.0,
            schedule=CosineSchedule(warmup_steps=375, decay_end=100_000, min_ratio=0.1),
        ),
        data=DataConfig(
            source=SyntheticSource(),
            seq_len=2048,
            train=InputConfig(batch_size=16),
            eval=InputConfig(batch_size=16, shuffle=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=4),
        ),
        train=TrainConfig(
            num_steps=100_000,
            eval_interval_steps=1000,
            summary_interval_steps=100,
            fprop_dtype="bfloat16",
            sample_at_end=False,
        ),
        checkpoint=CheckpointConfig(every_n_steps=1000, max_to_keep=3, async_save=True),
    )


@register("gpt3_xl_unrolled", aliases=("Gpt3XLUnrolled",))
def gpt3_xl_unrolled() -> ExperimentConfig:
    """gpt3_xl with the layer scan fully unrolled (XLA schedules across layers; longer compile)."""
    exp = gpt3_xl()
    return exp.replace(name="gpt3_xl_unrolled", model=exp.model.replace(unroll=exp.model.num_layers))
