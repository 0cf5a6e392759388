"""CUDA checks; skipped cleanly on machines without a GPU (CI runs on CPU)."""

import pytest
import torch
from helpers import tiny_model

from hispec.engine.config import preset
from hispec.model.early_exit import EarlyExitModel
from hispec.runs.runner import run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_float32_on_cuda_equals_generate(arch):
    model = tiny_model(arch, seed=5).cuda()
    ee = EarlyExitModel(model)
    prompt = [5, 17, 33, 2, 9, 41]
    x = torch.tensor([prompt], device="cuda")
    ref = model.generate(x, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(x))[0, len(prompt):].tolist()
    for config in (preset("autoregressive"), preset("layerskip", draft_layer=3, policy="fixed"),
                   preset("hispec", draft_layer=2, verify_layer=5, policy="fixed")):
        from dataclasses import replace

        assert run(ee, prompt, replace(config, max_new_tokens=32)).token_ids == ref
    assert ee.device.type == "cuda"


def test_bfloat16_runs_on_cuda():
    model = tiny_model("llama", seed=5).cuda().to(torch.bfloat16)
    ee = EarlyExitModel(model)
    r = run(ee, [5, 6, 7], preset("hispec", max_new_tokens=24, policy="fixed"))
    assert len(r.token_ids) == 24 and r.settings["dtype"] == "bfloat16" and r.settings["device"].startswith("cuda")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_cuda_graphs_float32_equal_generate_and_replay(arch):
    from dataclasses import replace

    model = tiny_model(arch, seed=5).cuda()
    ee = EarlyExitModel(model)
    ee.set_graphs("cuda")
    prompt = [5, 17, 33, 2, 9, 41]
    x = torch.tensor([prompt], device="cuda")
    ref = model.generate(x, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(x))[0, len(prompt):].tolist()
    for config in (preset("autoregressive"), preset("layerskip", draft_layer=3, draft_len=3, policy="fixed"),
                   preset("hispec", draft_layer=2, verify_layer=5, draft_len=2, verify_threshold=3,
                                policy="fixed")):
        for _ in range(2):  # the second run replays the graphs captured by the first
            r = run(ee, prompt, replace(config, max_new_tokens=32))
            assert r.token_ids == ref and r.settings["graphs"] == "cuda"
    assert ee.graphs.captures == len(ee.graphs.graphs) > 0 and ee.graphs.replays > 3 * 31
    assert not ee.graphs.storage.in_use()


def test_cuda_graphs_in_bfloat16_run():
    model = tiny_model("llama", seed=5).cuda().to(torch.bfloat16)
    ee = EarlyExitModel(model)
    ee.set_graphs("cuda")
    r = run(ee, [5, 6, 7], preset("hispec", max_new_tokens=24, policy="fixed"))
    assert len(r.token_ids) == 24 and ee.graphs.replays > 0
