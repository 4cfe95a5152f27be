"""BertModelConfig's own checks and its vocabulary rule (models.bert_model); no model is built.

The numbers are Praxis' (tests/praxis/test_praxis_bert.py), the masking's statistics are
tests/layers/test_masked_lm.py's, and the command line is tests/models/test_bert_cli.py's.
"""

from __future__ import annotations

import pytest

from experiments import registry
from pax_eqx.config import ConfigError
from pax_eqx.layers import AttentionConfig, TransformerConfig
from pax_eqx.models import BertModelConfig

TINY = dict(vocab_size=33, max_seq_len=8, num_layers=1, model_dims=16, hidden_dims=32, num_heads=2)


def test_attention_must_be_bidirectional():
    causal = BertModelConfig(**TINY, block=TransformerConfig(attention=AttentionConfig(causal=True)))
    with pytest.raises(ConfigError, match=r"model\.block\.attention\.causal=True"):
        causal.validate()
    BertModelConfig(**TINY).validate()  # the default block attends both ways


@pytest.mark.parametrize("mask", [-1, 33])
def test_the_mask_is_an_id_of_the_vocabulary(mask):
    with pytest.raises(ConfigError, match="mask_token_id"):
        BertModelConfig(**TINY, mask_token_id=mask).validate()


def test_a_mask_of_its_own_stays_past_a_new_tokenizers_ids():
    """A prepared corpus's tokenizer sets the vocabulary (command_line/data_files.py): the byte
    BERT's mask (the last id, past the tokenizer's) moves past the new ids; a mask inside the
    vocabulary (Paxml's 0) stays."""
    byte_bert = registry.load_experiment("bert_shakespeare_char").model
    assert (byte_bert.vocab_size, byte_bert.mask_token_id) == (261, 260)
    moved = byte_bert.with_token_vocab_size(32000)
    assert (moved.vocab_size, moved.mask_token_id) == (32001, 32000)
    pax = registry.load_experiment("BertSpmdL4H128").model
    kept = pax.with_token_vocab_size(8000)
    assert (kept.vocab_size, kept.mask_token_id) == (8000, 0)


def test_paxmls_bert_is_the_language_model_made_bidirectional():
    """The Paxml experiments' BERT keeps every field of the PaxLm language model it came from but
    the attention's direction (and the L33 / L66 label smoothing)."""
    bert = registry.load_experiment("bert_spmd_l33h12k_bigger_batch").model
    assert not bert.block.attention.causal and bert.block.attention.mask_mode == "praxis"
    assert bert.label_smoothing_prob == 0.1 and bert.mask_token_id == 0
    assert bert.position_embedding == "sinusoidal" and bert.block.attention.combine_qkv
    assert (bert.soft_cap_logits, bert.block.attention.logit_cap) == (30.0, 50.0)
