"""pax_eqx.layers: Praxis' layers as immutable Equinox modules, each built from a frozen config.

    from pax_eqx import layers
    ff = layers.FeedForwardConfig(input_dims=8, output_dims=16).build(key)
    y = ff(x)

One concept a file; this package re-exports them all.
"""

from pax_eqx.layers.activations import Activation, ActivationConfig, geglu, swiglu
from pax_eqx.layers.attention_config import AttentionConfig
from pax_eqx.layers.attention_position_bias import AlibiConfig, NoPositionBiasConfig, TransformerXLConfig
from pax_eqx.layers.attention_window import GlobalWindowConfig, SlidingWindowConfig
from pax_eqx.layers.attentions import Attention, KVCache
from pax_eqx.layers.base import (
    Context,
    Mode,
    Variable,
    apply,
    call,
    init,
    mean_sync_markers,
    split_state,
    variable,
)
from pax_eqx.layers.batch_norm import BatchNorm, BatchNormConfig
from pax_eqx.layers.convolutions import Conv2D, Conv2DConfig
from pax_eqx.layers.embedding_softmax import (
    Embedding,
    EmbeddingConfig,
    FullSoftmax,
    SharedEmbeddingSoftmax,
    SharedEmbeddingSoftmaxConfig,
    SoftmaxConfig,
    cross_entropy,
    soft_cap,
)
from pax_eqx.layers.initializers import WeightInit, constant, gaussian, xavier
from pax_eqx.layers.linears import (
    Bias,
    BiasConfig,
    FeedForward,
    FeedForwardConfig,
    Linear,
    LinearConfig,
    MLPBlock,
    MLPBlockConfig,
)
from pax_eqx.layers.masked_lm import MaskedLmAugmenter, MaskedLmConfig
from pax_eqx.layers.mlps import MLP, HiddenLayer, MLPConfig
from pax_eqx.layers.moe import MoEFeedForward, MoEFeedForwardConfig
from pax_eqx.layers.moe_routing import (
    Routing,
    RoutingStats,
    capacity,
    load_balance_loss,
    router_entropy,
    router_z_loss,
    top2_gating,
    topk_gating,
)
from pax_eqx.layers.normalizations import (
    LayerNorm,
    LayerNormConfig,
    NormConfig,
    RmsNorm,
    RmsNormConfig,
    RmsNormNoScaleConfig,
    rms_norm_no_scale,
)
from pax_eqx.layers.poolings import GlobalPooling, GlobalPoolingConfig, Pooling, PoolingConfig, global_average_pool
from pax_eqx.layers.position_embeddings import (
    TrainablePositionalEmbedding,
    TrainablePositionalEmbeddingConfig,
    apply_rotary,
    sinusoidal_position_embedding,
)
from pax_eqx.layers.relative_position_bias import (
    RelativePositionBias,
    RelativePositionBiasConfig,
    relative_position_bucket,
)
from pax_eqx.layers.repeats import StackedTransformer, StackedTransformerConfig
from pax_eqx.layers.resnets import (
    ConvBN,
    ResNet,
    ResNetBlock,
    ResNetBlockConfig,
    ResNetConfig,
    resnet18,
    resnet34,
    resnet50,
    resnet101,
    resnet152,
)
from pax_eqx.layers.scanned_stack import StackedTransformerRepeated
from pax_eqx.layers.stochastics import Dropout, DropoutConfig, StochasticResidual, StochasticResidualConfig
from pax_eqx.layers.transformers import Transformer, TransformerConfig
from pax_eqx.layers.vits import ViT, ViTConfig, patchify

__all__ = [name for name in dir() if not name.startswith("_")]
