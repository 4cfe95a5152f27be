"""The PEFT layout of adapters on GPT-2, whose Conv1D weights are [in, out] (`fan_in_fan_out`): the
tensors' math against the weight plan's own layout change (numpy, no model run); its fused c_attn
refused by name. (Llama's [out, in] case: tests/hf/test_lora_end_to_end.py.)"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hf_models import FIXTURES

from pax_eqx.config import ConfigError
from pax_eqx.hf.importer import HfSource
from pax_eqx.hf.peft_export import peft_tensors, target_modules
from pax_eqx.hf.weights import Dims, weight_plan
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.learners.variables import param_names
from pax_eqx.tasks.lora_adapters import plan_targets


def gpt2(targets):
    model = HfSource.open(FIXTURES / "gpt2").model
    params = jax.eval_shape(lambda: model.build(jax.random.PRNGKey(0)))  # shapes only: nothing is computed
    lora = LoraConfig(targets=targets, rank=3, alpha=6.0, base_job_dir="b")
    return model, plan_targets(lora, params), param_names(params)


def test_gpt2_conv1d_adapters_are_peft_tensors_of_the_merged_delta():
    model, targets, names = gpt2((r"stack\.layers\.attention\.w_o", r"stack\.layers\.ff_in\.linear\.w"))
    rng = np.random.default_rng(0)
    adapters = {n: (rng.normal(size=t.a_shape(3)), rng.normal(size=t.b_shape(3))) for n, t in targets.items()}
    tensors, modules, fan_in_fan_out = peft_tensors("gpt2", model, targets, adapters, names)
    assert fan_in_fan_out and len(modules) == 2 * model.num_layers
    dims = Dims(model.model_dims, model.num_heads, model.num_kv_heads or model.num_heads, model.head_dim)
    made = weight_plan("gpt2", dims, model.num_layers, names, True).producer()
    for name, (a, b) in adapters.items():
        entry, _ = made[name]
        for i in range(model.num_layers):
            delta = np.tensordot(a[i], b[i], axes=([-1], [0]))  # our layout: [*in, *out]
            module = "base_model.model.transformer." + entry.hf.format(i=i).removesuffix(".weight")
            lora_a, lora_b = tensors[module + ".lora_A.weight"], tensors[module + ".lora_B.weight"]
            hf_delta = entry.to_hf((delta,))  # Conv1D [in, out]
            assert lora_a.shape == (3, hf_delta.shape[0]) and lora_b.shape == (hf_delta.shape[1], 3)
            np.testing.assert_allclose(hf_delta, (lora_b @ lora_a).T, rtol=1e-10, atol=1e-10)
    # "c_proj" names both attn.c_proj and mlp.c_proj: only the adapted ones are listed, by full name
    listed = target_modules(modules, [m.replace(".attn.c_proj", ".mlp.c_proj") for m in modules] + modules)
    assert "c_fc" in listed and "c_proj" not in listed and "transformer.h.0.attn.c_proj" in listed


def test_gpt2_q_k_v_fused_into_c_attn_are_refused_with_the_merged_export():
    model, targets, names = gpt2((r"stack\.layers\.attention\.w_q",))
    adapters = {n: (np.zeros(t.a_shape(3)), np.zeros(t.b_shape(3))) for n, t in targets.items()}
    with pytest.raises(ConfigError, match=r"stack\.layers\.attention\.w_q .*fused tensor.*export the merged model"):
        peft_tensors("gpt2", model, targets, adapters, names)
