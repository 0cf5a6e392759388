"""Sweep mode on a tiny model: grids, JSON schema, speedups, heatmaps, invalid grids, interrupts."""

import json
import math
import threading

import pytest
from helpers import save_tiny_folder

from hispec.evaluation import sweep as sweep_mod
from hispec.cli.main import main
from hispec.engine.config import preset
from hispec.errors import ConfigError
from hispec.data.prompts import Prompt
from hispec.evaluation.report import sweep_figures, write_html
from hispec.evaluation.sweep import Grid, build_grids, parse_values, resolve_grids, summarise_sweep, sweep

SETS = {"mine": [Prompt("h", "hello"), Prompt("a", "abc", chat=False)], "more": [Prompt("x", "xyz")]}
LAYERS = Grid("layers", (1, 2, 4), (2, 4, 6))  # 8 layers: default d=1, v=2; (2,2), (4,2), (4,4) invalid
LENGTHS = Grid("lengths", (1, 2), (2, 3))  # default (2, 4) is not on this grid


@pytest.fixture(scope="module")
def lm(tiny_loaded):
    return tiny_loaded


@pytest.fixture(scope="module")
def swept(lm, tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "s.json"
    seen = []
    report = sweep(lm, SETS, [LAYERS, LENGTHS], preset("hispec", max_new_tokens=12, policy="fixed"),
                   json_path=str(path), progress=lambda d, t, w: seen.append((d, t, w, json.loads(path.read_text()))))
    return report, path, seen


def test_json_schema_speedups_and_equality(swept):
    report, path, seen = swept
    saved = json.loads(path.read_text())
    assert saved == json.loads(json.dumps(report))
    points = 1 + len(LAYERS.cells()) + len(LENGTHS.cells())  # the reference + every valid grid point
    assert len(LAYERS.cells()) == 6 and points == 11
    # written after every prompt, progress called with (done, total, what)
    assert [(d, t, w) for d, t, w, _ in seen] == [(1, 3, "mine/h"), (2, 3, "mine/a"), (3, 3, "more/x")]
    assert [len(s["records"]) for *_, s in seen] == [points, 2 * points, 3 * points]
    assert saved["kind"] == "sweep" and saved["complete"] is True and saved["stopped"] is False
    env = saved["environment"]
    assert env["model"] == "tiny" and env["layers"] == 8 and {"torch", "threads", "device", "dtype"} <= set(env)
    assert {"cpu", "avx512", "loadavg_start", "loadavg_end"} <= set(env)
    assert set(saved["code"]) == {"commit", "dirty"} and "prior_weight" in saved["priors"]
    assert saved["config"]["max_new_tokens"] == 12 and saved["config"]["policy"] == "fixed"
    assert saved["defaults"] == {"draft_layer": 1, "verify_layer": 2, "draft_len": 2, "verify_threshold": 4}
    assert saved["grids"]["layers"]["fixed"] == {"draft_len": 2, "verify_threshold": 4}
    assert saved["grids"]["lengths"]["fixed"] == {"draft_layer": 1, "verify_layer": 2}
    skipped = [(s["draft_layer"], s["verify_layer"]) for s in saved["grids"]["layers"]["skipped"]]
    assert skipped == [(2, 2), (4, 2), (4, 4)]
    assert all("is not below verify layer" in s["reason"] for s in saved["grids"]["layers"]["skipped"])
    s = saved["summary"]
    ref = s["reference"]
    assert ref["prompts"] == 3 and ref["tokens_per_s"] > 0
    assert s["all_outputs_equal"] is True  # greedy hispec equals autoregressive at every point
    for name, grid in (("layers", LAYERS), ("lengths", LENGTHS)):
        g = s["grids"][name]
        a, b = grid.axes
        assert [(c[a], c[b]) for c in g["cells"]] == grid.cells()
        for c in g["cells"]:
            assert c["prompts"] == 3 and c["outputs_equal"] is True
            assert c["speedup"] == pytest.approx(c["tokens_per_s"] / ref["tokens_per_s"])
            mine = [r for r in saved["records"] if r["grid"] == name and (r[a], r[b]) == (c[a], c[b])]
            ratios = [r["tokens_per_s"] / next(x["tokens_per_s"] for x in saved["records"] if x["grid"] is None
                                               and x["prompt_id"] == r["prompt_id"]) for r in mine]
            assert c["speedup_geomean"] == pytest.approx(math.prod(ratios) ** (1 / len(ratios)))
            assert (c["speedup_min"], c["speedup_max"]) == (pytest.approx(min(ratios)), pytest.approx(max(ratios)))
            assert set(c["acceptance"]) == {"draft->verify", "verify->target"}
        best = max(g["cells"], key=lambda c: c["speedup_geomean"])  # the best point by the per-prompt figure
        assert (g["best"][a], g["best"][b], g["best"]["speedup_geomean"]) == (best[a], best[b], best["speedup_geomean"])
    assert s["grids"]["layers"]["default"]["on_grid"] is True
    assert s["grids"]["layers"]["default"]["speedup"] == s["grids"]["layers"]["cells"][0]["speedup"]
    assert s["grids"]["lengths"]["default"] == {"draft_len": 2, "verify_threshold": 4, "on_grid": False,
                                                "speedup": None, "speedup_geomean": None}
    # every prompt's points ran in the one balanced order (evaluation.order), recorded by name
    ran = [saved["records"][i * points : (i + 1) * points] for i in range(3)]
    assert saved["order"]["design"] == "williams" and saved["order"]["cycle"] == 2 * points  # 11 points: odd
    assert [len(p) for p in saved["order"]["passes"]] == [points] * 3
    where = [[(r["grid"], r.get("draft_layer"), r.get("verify_layer"), r.get("draft_len")) for r in p] for p in ran]
    assert where[0][0] == (None, None, None, None) and where[1] == where[0][::-1]  # a pass, then its mirror
    assert saved["order"]["passes"][0][0] == "autoregressive" and saved["order"]["passes"][0][1] == "layers d=1 v=2"
    assert saved["order"]["passes"][1] == saved["order"]["passes"][0][::-1]


def test_equality_flag_goes_false_when_a_point_differs(swept):
    report = json.loads(json.dumps(swept[0]))
    rec = next(r for r in report["records"] if r["grid"] == "lengths")
    rec["token_ids"] = rec["token_ids"][:-1] + [0]
    s = summarise_sweep(report)
    assert s["all_outputs_equal"] is False
    bad = [c for c in s["grids"]["lengths"]["cells"] if not c["outputs_equal"]]
    assert [(c["draft_len"], c["verify_threshold"]) for c in bad] == [(rec["draft_len"], rec["verify_threshold"])]


def test_heatmaps_in_the_html_mark_best_and_default(swept, tmp_path):
    report = swept[0]
    figs = sweep_figures(report)
    assert len(figs) == 4  # per grid: speedup heatmap + acceptance heatmaps
    speed = figs[0]
    assert speed.data[0].type == "heatmap"
    assert list(speed.data[0].x) == ["2", "4", "6"] and list(speed.data[0].y) == ["1", "2", "4"]
    assert speed.data[0].z[1][0] is None and speed.data[0].text[1][0] == "skipped"  # d=2, v=2
    names = [t.name for t in speed.data if t.type == "scatter"]
    best = report["summary"]["grids"]["layers"]["best"]
    assert names[0].startswith("default (d=1, v=2)")
    assert names[1].startswith(f"best (d={best['draft_layer']}, v={best['verify_layer']}) {best['speedup_geomean']:.2f}×")
    marked = {t.name.split()[0]: (t.x[0], t.y[0]) for t in speed.data if t.type == "scatter"}
    assert marked == {"default": ("2", "1"), "best": (str(best["verify_layer"]), str(best["draft_layer"]))}
    lengths = figs[2]
    assert "default (draft_len=2, threshold=4) not on this grid" in lengths.layout.title.text
    assert [t.name.split()[0] for t in lengths.data if t.type == "scatter"] == ["best"]
    assert {t.name for t in figs[1].data if t.type == "heatmap"} == {"draft->verify", "verify->target"}
    out = tmp_path / "s.html"
    write_html(report, str(out))
    page = out.read_text()
    assert page.count("Plotly.newPlot") == 4 and page.count("plotly.js v") == 1  # plotly.js embedded once
    assert "HiSpec sweep" in page and '"type":"heatmap"' in page
    assert "best (d=" in page and "default (d=1, v=2)" in page
    assert "skipped: draft layer 2 is not below verify layer 2" in page


@pytest.mark.parametrize("make, message", [
    (lambda: Grid("layers", (4, 6), (2, 4)), r"the layers grid has no valid point: every draft layer \(4, 6\)"),
    (lambda: Grid("depth", (1,), (2,)), "unknown sweep 'depth'; choose from layers, lengths"),
    (lambda: parse_values("2,0", "--draft-layers"), "0 is not allowed, every value must be a whole number >= 1"),
    (lambda: parse_values("2,x", "--draft-lens"), "'x' is not a whole number or a range like 2-6"),
    (lambda: parse_values("6-3", "--verify-layers"), "the range '6-3' is empty"),
    (lambda: parse_values(" , ", "--verify-layers"), "--verify-layers is empty"),
    (lambda: build_grids("layers,widths"), "unknown sweep 'widths'"),
    (lambda: build_grids("lengths", draft_layers="1,2"), "--draft-layers/--verify-layers need --sweep layers"),
    (lambda: build_grids("layers", draft_lens="1,2"), "--draft-lens/--verify-thresholds need --sweep lengths"),
    (lambda: resolve_grids(build_grids("layers", "1,2", "4,9"), 8),
     r"layer\(s\) 9 of the layers sweep are impossible: this model has 8 layers, so draft and verify layers "
     "must be between 1 and 7"),
])
def test_invalid_grids_are_clear_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_grid_parsing_and_model_defaults():
    assert parse_values("4,2-3,2", "x") == (2, 3, 4)
    grids = resolve_grids(build_grids("layers,lengths"), 30)
    assert (grids[0].rows, grids[0].cols) == ((2, 4, 6), (8, 11, 15))  # around d = L/8, v = L/4
    assert (grids[1].rows, grids[1].cols) == ((1, 2, 3, 4), (2, 4, 6, 8))
    partial = resolve_grids(build_grids("layers", draft_layers="1,3"), 8)
    assert partial[0].rows == (1, 3) and partial[0].cols == (2, 3, 4)


def test_interrupt_keeps_the_results_so_far(lm, tmp_path):
    path = tmp_path / "i.json"

    def interrupt(done, total, what):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(lm, SETS, [LENGTHS], preset("hispec", max_new_tokens=8, policy="fixed"), json_path=str(path),
              warmup=False, progress=interrupt)
    saved = json.loads(path.read_text())
    assert saved["complete"] is False
    assert {r["prompt_id"] for r in saved["records"]} == {"h"} and len(saved["records"]) == 1 + 4
    assert saved["summary"]["reference"]["prompts"] == 1
    assert all(c["prompts"] == 1 for c in saved["summary"]["grids"]["lengths"]["cells"])


def test_stop_ends_the_sweep_between_points(lm):
    stop = threading.Event()
    report = sweep(lm, SETS, [LENGTHS], preset("hispec", max_new_tokens=8, policy="fixed"), warmup=False,
                   progress=lambda d, t, w: stop.set(), stop=stop)
    assert report["stopped"] is True and report["complete"] is False
    assert {r["prompt_id"] for r in report["records"]} == {"h"}


def test_cli_sweep_writes_json_and_html_and_survives_an_interrupt(tmp_path, capsys, monkeypatch):
    folder = save_tiny_folder(tmp_path / "m")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"prompt": "abc", "chat": false}\n')
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    args = ["bench", "--model", str(folder), "--prompts", str(prompts), "--max-new-tokens", "8", "--no-warmup",
            "--sweep", "layers", "--draft-layers", "1,2", "--verify-layers", "2,4", "--json", str(out_json),
            "--html", str(out_html)]
    assert main(args) == 0
    report = json.loads(out_json.read_text())
    cells = report["summary"]["grids"]["layers"]["cells"]
    assert [(c["draft_layer"], c["verify_layer"]) for c in cells] == [(1, 2), (1, 4), (2, 4)]
    assert report["complete"] and report["summary"]["all_outputs_equal"]
    out = capsys.readouterr().out
    assert "layers sweep (draft_len=2, verify_threshold=4)" in out and "skipped: draft layer 2 is not below" in out
    assert "Plotly.newPlot" in out_html.read_text()
    # Ctrl-C after the first prompt: exit code 130, the JSON and the HTML hold that prompt
    real = sweep_mod.sweep

    def interrupted(*a, **k):
        def boom(done, total, what):
            raise KeyboardInterrupt
        return real(*a, **{**k, "progress": boom})

    monkeypatch.setattr(sweep_mod, "sweep", interrupted)
    out_html.unlink()
    assert main(args) == 130
    partial = json.loads(out_json.read_text())
    assert partial["complete"] is False and len(partial["records"]) == 1 + 3
    assert "HiSpec sweep" in out_html.read_text()


def test_cli_sweep_errors_before_and_after_loading(tmp_path, capsys):
    # an empty grid fails before the model loads (the model name does not even exist)
    code = main(["bench", "--model", str(tmp_path / "nowhere"), "--sweep", "layers", "--draft-layers", "6",
                 "--verify-layers", "2,4"])
    assert code == 2 and "the layers grid has no valid point" in capsys.readouterr().err
    code = main(["bench", "--model", str(tmp_path / "nowhere"), "--sweep", "lengths", "--methods", "hispec"])
    assert code == 2 and "--methods and --layerskip-exit do not apply to --sweep" in capsys.readouterr().err
    code = main(["bench", "--model", str(tmp_path / "nowhere"), "--draft-lens", "1,2"])
    assert code == 2 and "--draft-lens/--verify-thresholds need --sweep lengths" in capsys.readouterr().err
    # a layer the model does not have fails after loading, before anything runs
    folder = save_tiny_folder(tmp_path / "m")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    out_json = tmp_path / "r.json"
    code = main(["bench", "--model", str(folder), "--prompts", str(prompts), "--sweep", "layers",
                 "--draft-layers", "1", "--verify-layers", "4,8", "--json", str(out_json)])
    assert code == 2 and "layer(s) 8 of the layers sweep are impossible: this model has 8 layers" in \
        capsys.readouterr().err
    assert not out_json.exists()
