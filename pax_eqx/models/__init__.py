"""pax_eqx.models: models that compose layers and define loss, metrics and decoding."""

from pax_eqx.models.classification_model import ClassificationModel, ClassificationModelConfig
from pax_eqx.models.decoding import SampleConfig, filter_logits, generate, sample_token
from pax_eqx.models.language_model import LanguageModel, LanguageModelConfig
from pax_eqx.models.model import Batch, Model, ModelConfig
