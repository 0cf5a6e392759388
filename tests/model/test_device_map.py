"""Layer-range execution through accelerate's hooks: a model spread by a device map, here with
half its layers offloaded to disk (the CPU stand-in for a model larger than one device)."""

import pytest
from helpers import hf_greedy, save_tiny_folder
from transformers import AutoModelForCausalLM

from hispec.engine.config import preset
from hispec.model.early_exit import EarlyExitModel
from hispec.runs.runner import run


@pytest.mark.parametrize("config", [preset("autoregressive"),
                                    preset("layerskip", draft_layer=4, policy="fixed"),
                                    preset("hispec", draft_layer=2, verify_layer=5, policy="fixed")],
                         ids=lambda c: c.method)
def test_offloaded_layers_give_the_same_greedy_output(tmp_path, config):
    from dataclasses import replace

    folder = save_tiny_folder(tmp_path / "m")
    plain = AutoModelForCausalLM.from_pretrained(folder)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    device_map.update({f"model.layers.{i}": "cpu" if i < 3 else "disk" for i in range(8)})
    spread = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map, offload_folder=tmp_path / "off")
    assert hasattr(spread.model.layers[5], "_hf_hook"), "accelerate should drive the offloaded layers"
    result = run(EarlyExitModel(spread), [5, 6, 7], replace(config, max_new_tokens=20))
    assert result.token_ids == hf_greedy(plain, [5, 6, 7], 20)
