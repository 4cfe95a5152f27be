"""pax_eqx.models: models that compose layers and define loss, metrics and decoding."""

from pax_eqx.models.beam_search import BeamResult, beam_search, length_normalize
from pax_eqx.models.bert_model import BertModel, BertModelConfig
from pax_eqx.models.classification_model import ClassificationModel, ClassificationModelConfig
from pax_eqx.models.decode_strategies.beam import BeamStrategy
from pax_eqx.models.decode_strategies.greedy import GreedyStrategy
from pax_eqx.models.decode_strategies.sample import SampleStrategy
from pax_eqx.models.decode_strategy import DecodeStrategy
from pax_eqx.models.decoding import SampleConfig, beam_search_lm, filter_logits, generate, sample, sample_token
from pax_eqx.models.incremental import IncrementalDecoder
from pax_eqx.models.language_model import LanguageModel, LanguageModelConfig
from pax_eqx.models.language_model_decoder import LanguageModelDecoder
from pax_eqx.models.model import Batch, Model, ModelConfig
from pax_eqx.models.sequence_model import SequenceModel, SequenceModelConfig, SequenceModelDecoder
