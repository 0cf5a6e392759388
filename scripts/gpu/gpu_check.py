"""GPU check: exactness in float32 on CUDA, bfloat16 mismatch rate, and timings of the three
methods on models built from configs (no downloads), written to one JSON report.

    python scripts/gpu/gpu_check.py --out gpu_check.json            # on a CUDA machine, a few minutes
    python scripts/gpu/gpu_check.py --device cpu --quick --out x.json  # smoke run anywhere

Timings use models with random weights in the shapes of LayerSkip Llama3.2-1B and Llama2-7B.
Random weights never agree across exits, so the acceptance decisions of those timing runs come
from hispec.runs.timing_only: a clearly labelled TIMING-ONLY mode whose text is not the model's, with
fixed rates (SyntheticAcceptance) and with the pattern recorded from the default model's real
generations (RecordedAcceptance, assets/gpu/acceptance_default_heldout.json). The figures show what
the hierarchy saves at a given acceptance on real step costs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hispec.engine.config import DecodeConfig, Preset  # noqa: E402
from hispec.model.early_exit import EarlyExitModel  # noqa: E402
from hispec.runs.runner import run  # noqa: E402
from hispec.runs.timing_only import RecordedAcceptance, SyntheticAcceptance  # noqa: E402

SHAPES = {
    # LayerSkip Llama3.2-1B / Llama2-7B shapes (random weights)
    "llama3.2-1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=4096,
                        rope_theta=500000.0, tie_word_embeddings=True,
                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                                      "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
    "llama2-7B": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),
    # for --quick smoke runs
    "small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1024, max_position_embeddings=1024),
}
RATES = [(0.9, 0.9), (0.8, 0.7), (0.6, 0.5)]  # (draft->verify, verify->target) per token
# runs of accepted tokens recorded from the default model and its exit heads (scripts/gpu/record_acceptance.py)
RECORDED = Path(__file__).resolve().parents[2] / "assets" / "gpu" / "acceptance_default_heldout.json"


def build(shape: str | dict, dtype, device, seed=0, std=None):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    kw = dict(SHAPES[shape]) if isinstance(shape, str) else dict(shape)
    arch = kw.pop("arch", "llama")
    if std is not None:
        kw["initializer_range"] = std
    torch.manual_seed(seed)
    cfg_cls, model_cls = (Qwen3Config, Qwen3ForCausalLM) if arch == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    with torch.device(device):
        model = model_cls(cfg_cls(**kw, bos_token_id=1, eos_token_id=2, pad_token_id=0)).to(dtype).eval()
    return model


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def hf_greedy(model, prompt, n, device):
    x = torch.tensor([prompt], device=device)
    out = model.generate(x, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(x))
    return out[0, len(prompt):].tolist()


def plain(n_new: int = 128) -> DecodeConfig:
    return DecodeConfig(preset=Preset("autoregressive"), max_new_tokens=n_new)


def single_exit(e: int, k: int, n_new: int = 128) -> DecodeConfig:
    """layerskip at exit e: k drafts per fixed round."""
    return DecodeConfig(levels=(e,), lengths=(k, None), preset=Preset("layerskip"), max_new_tokens=n_new,
                        policy="fixed")


def two_exits(d: int, v: int, lengths: tuple[int, int], n_new: int = 128) -> DecodeConfig:
    """hispec at exits d and v, fixed rounds of these lengths."""
    return DecodeConfig(levels=(d, v), lengths=lengths, max_new_tokens=n_new, policy="fixed")


# plain decoding, then layerskip, hispec at the model's own exits, hispec at (1, 3)
SETTINGS = [plain(), single_exit(2, 3), DecodeConfig(preset=Preset("hispec"), policy="fixed"), two_exits(1, 3, (3, 2))]


def exactness(device, quick):
    """float32 on the device: every method's greedy ids equal transformers' generate()."""
    from dataclasses import replace

    results = []
    archs = [dict(arch="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=100, max_position_embeddings=256),
             dict(arch="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=100, max_position_embeddings=256)]
    if not quick:
        archs.append(dict(arch="llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=12,
                          num_attention_heads=8, num_key_value_heads=4, vocab_size=4096, max_position_embeddings=512))
    for spec in archs:
        model = build(spec, torch.float32, device, std=0.3 if spec["vocab_size"] <= 100 else 0.05)
        eager, graphed = EarlyExitModel(model), EarlyExitModel(model)
        graphed.set_graphs(graph_backend(device))
        for seed in range(2 if quick else 4):
            g = torch.Generator().manual_seed(seed)
            prompt = torch.randint(3, spec["vocab_size"], (7 + 5 * seed,), generator=g).tolist()
            ref = hf_greedy(model, prompt, 40, device)
            for config in SETTINGS:
                for mode, ee in (("eager", eager), ("graphs", graphed)):
                    r = run(ee, prompt, replace(config, max_new_tokens=40))
                    results.append({"arch": spec["arch"], "hidden": spec["hidden_size"], "seed": seed,
                                    "method": config.method, "mode": mode, "equal": r.token_ids == ref})
        del model, eager, graphed
    return {"dtype": "float32", "runs": len(results), "all_equal": all(r["equal"] for r in results),
            "graph_runs": sum(r["mode"] == "graphs" for r in results),
            "failures": [r for r in results if not r["equal"]]}


def graph_backend(device: str) -> str:
    """Real CUDA graphs on a GPU; the same static-shape passes without capture elsewhere (smoke runs)."""
    return "cuda" if device.startswith("cuda") else "emulate"


def bf16_mismatch(device, quick):
    """bfloat16: how often a speculative output differs from our autoregressive output."""
    spec = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=12, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=4096, max_position_embeddings=512)
    model = build(spec, torch.bfloat16, device, std=0.05)
    n_prompts, n_new = (2, 32) if quick else (16, 64)  # bf16 on a CPU is slow: the smoke run stays small
    out = {"model": "random 12-layer llama (hidden 512, vocab 4096), bf16", "prompts": n_prompts, "methods": {},
           "graphs_vs_eager_autoregressive_differs": 0}
    eager_refs = None
    for mode in ("eager", "graphs"):
        ee = EarlyExitModel(model)
        if mode == "graphs":
            ee.set_graphs(graph_backend(device))
        refs = []
        for seed in range(n_prompts):
            g = torch.Generator().manual_seed(100 + seed)
            prompt = torch.randint(3, 4096, (16,), generator=g).tolist()
            refs.append((prompt, run(ee, prompt, plain(n_new)).token_ids))
        if eager_refs is None:
            eager_refs = refs
        else:  # graph passes attend over a masked full buffer: bf16 rounding may differ from eager
            out["graphs_vs_eager_autoregressive_differs"] = sum(a[1] != b[1] for a, b in zip(refs, eager_refs))
        for config in SETTINGS[1:]:
            diff, first = 0, []
            for prompt, ref in refs:
                ids = run(ee, prompt, replace(config, max_new_tokens=n_new)).token_ids
                if ids != ref:
                    diff += 1
                    first.append(next(i for i, (a, b) in enumerate(zip(ids, ref)) if a != b))
            d, v = config.exit_layer("draft"), config.exit_layer("verify")
            key = f"{config.method}(d={d},v={v})" + ("+graphs" if mode == "graphs" else "")
            out["methods"][key] = {"differs": diff, "rate": diff / n_prompts, "first_divergence": first}
    return out


def step_costs(ee, d, v, device, reps):
    """Milliseconds of one pass: draft (layers [0,d) + exit head, 1 token), intermediate [d,v)
    and remaining [v,L) and full [0,L) over k tokens, with a 128-token context."""
    L, hidden = ee.num_layers, ee.config.hidden_size
    out = {}

    def timed(fn):
        times = []
        for i in range(reps + 2):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1000)
        return round(statistics.median(times), 3)

    for k in (1, 2, 4, 8):
        x = torch.randn(1, k, hidden, device=device, dtype=ee.dtype)
        ctx = torch.randn(1, 128, hidden, device=device, dtype=ee.dtype)

        def segment(a, b, head=None):
            cache = ee.new_cache(160)  # with graphs: the static buffers, given back below
            ee.run_layers(ctx, 0, L, cache)  # fill the context once

            def go():
                for layer in range(L):
                    cache.crop(layer, 128)
                h = ee.run_layers(x, a, b, cache)
                if head is not None:
                    ee.exit_logits(h[:, -1:], head).argmax(-1)
            ms = timed(go)
            cache.release()
            return ms

        out[k] = {"draft_pass_d": segment(0, d, head=d), "verify_pass_d_to_v": segment(d, v),
                  "rest_pass_v_to_L": segment(v, L), "full_pass_0_to_L": segment(0, L),
                  "final_head": timed(lambda: ee.exit_logits(x, L))}
    return out


def side_by_side(ee, prompt, d, v, n_new, ar_tps, ls_judge, hs_judge) -> dict:
    """layerskip (exit v, 4 drafts a round) and hispec (d, v, lengths (2, 4)) under timing-only
    acceptance judges: tokens/s, ratios, acceptance reached, passes and syncs per round."""
    ls = run(ee, prompt, single_exit(v, 4, n_new), judge=ls_judge)
    hs = run(ee, prompt, two_exits(d, v, (2, 4), n_new), judge=hs_judge)
    return dict(layerskip_tokens_per_s=ls.stats["tokens_per_s"], hispec_tokens_per_s=hs.stats["tokens_per_s"],
                layerskip_vs_ar=ls.stats["tokens_per_s"] / ar_tps, hispec_vs_ar=hs.stats["tokens_per_s"] / ar_tps,
                hispec_vs_layerskip=hs.stats["tokens_per_s"] / ls.stats["tokens_per_s"],
                layerskip_acceptance=ls.stats["acceptance"], hispec_acceptance=hs.stats["acceptance"],
                hispec_tokens_per_full_pass=hs.stats["tokens_per_full_pass"],
                layerskip_tokens_per_full_pass=ls.stats["tokens_per_full_pass"],
                timing_only=hs.settings.get("timing_only"),
                # host-device transfers: one per verification decision (drafts travel with it)
                layerskip_syncs_per_round=ls.stats["host_syncs"] / max(ls.stats["rounds"], 1),
                hispec_syncs_per_round=hs.stats["host_syncs"] / max(hs.stats["rounds"], 1),
                hispec_full_passes_per_round=hs.stats["full_passes"] / max(hs.stats["rounds"], 1))


def timings(shape, device, dtype, quick, modes=("eager", "graphs")):
    """Tokens/s of the methods and per-stage step costs, per execution mode (eager, CUDA graphs)."""
    model = build(shape, dtype, device, std=0.02)
    ee = EarlyExitModel(model)
    L = ee.num_layers
    d, v = max(1, round(L / 8)), max(2, round(L / 4))
    n_new = 32 if quick else 128
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (128,), generator=g).tolist()
    report = {"shape": shape, "layers": L, "dtype": str(dtype).replace("torch.", ""), "exits": [d, v],
              "new_tokens": n_new,
              "engine_path": "lean" if ee.lean is not None else f"stock ({ee.stock_reason})"}
    hf_greedy(model, prompt, 8, device)  # warm-up: the first calls on a fresh model pay for library set-up
    sync(device)
    t = time.perf_counter()
    hf_greedy(model, prompt, n_new, device)
    sync(device)
    report["hf_generate_tokens_per_s"] = n_new / (time.perf_counter() - t)
    for mode in modes:
        ee.set_graphs(graph_backend(device) if mode == "graphs" else None)
        t0 = time.perf_counter()
        # warm-up (and, with graphs, the captures), then alternate methods so noise hits all alike
        run(ee, prompt, plain(8))
        for p_dv, p_vt in RATES[:1]:
            run(ee, prompt, single_exit(v, 4, n_new), judge=SyntheticAcceptance(1.0, p_vt, seed=1))
            run(ee, prompt, two_exits(d, v, (2, 4), n_new), judge=SyntheticAcceptance(p_dv, p_vt, seed=1))
        part = {"warmup_s": round(time.perf_counter() - t0, 2),
                "step_ms": step_costs(ee, d, v, device, 3 if quick else 10)}
        ar = []
        for _ in range(1 if quick else 2):
            sync(device)
            ar.append(run(ee, prompt, plain(n_new)).stats["tokens_per_s"])
        part["autoregressive_tokens_per_s"] = max(ar)
        ar_tps = part["autoregressive_tokens_per_s"]
        part["synthetic"] = []
        for p_dv, p_vt in RATES:
            row = {"p_draft_verify": p_dv, "p_verify_target": p_vt}
            row.update(side_by_side(ee, prompt, d, v, n_new, ar_tps, SyntheticAcceptance(1.0, p_vt, seed=1),
                                    SyntheticAcceptance(p_dv, p_vt, seed=1)))
            part["synthetic"].append(row)
        if RECORDED.exists():  # the acceptance pattern of real generations (scripts/gpu/record_acceptance.py)
            ls_judge = RecordedAcceptance.load(RECORDED, "layerskip")
            hs_judge = RecordedAcceptance.load(RECORDED, "hispec")
            part["recorded"] = {"layerskip_pattern": ls_judge.source, "hispec_pattern": hs_judge.source,
                                **side_by_side(ee, prompt, d, v, n_new, ar_tps, ls_judge, hs_judge)}
        if ee.graphs is not None:
            part["graph_captures"], part["graph_replays"] = ee.graphs.captures, ee.graphs.replays
            part["graphs_disabled"] = ee.graphs.disabled  # None, or why capture failed (then eager)
        report[mode] = part
    if "eager" in report and "graphs" in report:
        report["graphs_vs_eager_autoregressive"] = (report["graphs"]["autoregressive_tokens_per_s"]
                                                    / report["eager"]["autoregressive_tokens_per_s"])
    del model, ee
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--quick", action="store_true", help="small shapes and counts (smoke test)")
    parser.add_argument("--shapes", default=None, help="comma-separated shapes to time (default: 1B and 7B)")
    parser.add_argument("--modes", default="eager,graphs",
                        help="execution modes to time: eager (kernel by kernel) and/or graphs (CUDA graph replays)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --device cpu for a smoke run", file=sys.stderr)
        return 2
    import transformers

    from hispec.evaluation.record import code_version

    report = {"command": "python scripts/gpu/gpu_check.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "env": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "python": platform.python_version(), "device": args.device,
                      "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
                      "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}}
    path = Path(args.out)

    def save():
        path.write_text(json.dumps(report, indent=1))

    t0 = time.time()
    for name, fn in (("exactness_fp32", lambda: exactness(args.device, args.quick)),
                     ("bf16_mismatch", lambda: bf16_mismatch(args.device, args.quick))):
        report[name] = fn()
        print(f"[{time.time() - t0:6.1f}s] {name}: {json.dumps(report[name])[:400]}", flush=True)
        save()
    shapes = args.shapes.split(",") if args.shapes else (["small"] if args.quick else ["llama3.2-1B", "llama2-7B"])
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    report["timings"] = []
    for shape in shapes:
        report["timings"].append(timings(shape, args.device, dtype, args.quick, tuple(args.modes.split(","))))
        print(f"[{time.time() - t0:6.1f}s] timings {shape}: {json.dumps(report['timings'][-1])[:600]}", flush=True)
        save()
    report["seconds"] = round(time.time() - t0, 1)
    save()
    print(f"gpu_check: wrote {path} in {report['seconds']} s; fp32 exact: {report['exactness_fp32']['all_equal']}")
    return 0 if report["exactness_fp32"]["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
