"""'heldout-fresh' (issue 51): a report split no development has touched. Its prompts are found in
the installed sets, belong to no other split and to no training, and no artifact under assets/ holds
one of them except the reports its file lists: a tuning run committed on it fails here."""

import json
from pathlib import Path

import pytest
from fresh_split import committed_json, touching

from hispec.data.prompts import FRESH_FILE, FRESH_NAME, load_fresh, load_sets
from hispec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SPLIT = json.loads(FRESH_FILE.read_text(encoding="utf-8"))
IDS = {i for ids in SPLIT["sets"].values() for i in ids}
PROMPTS = [p for ps in load_fresh().values() for p in ps]


def working_tree() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8", errors="replace"))
            for path in sorted((ROOT / "assets").rglob("*.json*"))]


def test_no_artifact_but_the_listed_reports_holds_a_fresh_prompt_now_or_ever():
    assert touching(working_tree(), PROMPTS, SPLIT) == []
    history = committed_json(ROOT)
    assert history, "the guard reads the git history of assets/: none found"
    assert touching(history, PROMPTS, SPLIT) == []


def test_the_guard_catches_a_run_by_id_by_former_id_and_by_text_alone():
    sample = PROMPTS[-1]  # a summary: it has a former id too
    former = next(old for old, new in SPLIT["renamed"]["ids"].items() if new == sample.id)
    runs = [("assets/bench/by_id.json", json.dumps({"records": [{"prompt_id": sample.id}]})),
            ("assets/bench/by_former_id.json", json.dumps({"records": [{"prompt_id": former}]})),
            ("assets/bench/by_text.json", json.dumps({"prompts": [{"id": "renamed", "text": sample.text}]})),
            ("assets/bench/clean.json", json.dumps({"records": [{"prompt_id": "HumanEval/0"}]}))]
    assert touching(runs, PROMPTS, SPLIT) == ["assets/bench/by_former_id.json", "assets/bench/by_id.json",
                                              "assets/bench/by_text.json"]
    assert touching(runs, PROMPTS, {**SPLIT, "reported_in": ["assets/bench/by_id.json"]}) == [
        "assets/bench/by_former_id.json", "assets/bench/by_text.json"]


def test_the_split_is_its_own_prompts_found_in_the_installed_sets():
    sets = load_sets(FRESH_NAME)
    assert set(sets) == {f"{FRESH_NAME}-{kind}" for kind in SPLIT["sets"]}
    assert [p.id for kind in SPLIT["sets"] for p in sets[f"{FRESH_NAME}-{kind}"]] == [
        i for kind in SPLIT["sets"].values() for i in kind]
    assert len(IDS) == 28 and all(p.text.strip() for ps in sets.values() for p in ps)
    held = json.loads((ROOT / "assets/prompts/heldout_split.json").read_text())["sets"]
    assert not IDS & {i for parts in held.values() for ids in parts.values() for i in ids}  # not tune, not report
    manifest = json.loads((ROOT / "assets/exits/smollm2-135m-instruct/manifest.json").read_text())
    trained = load_sets(manifest["training"]["prompt_spec"], seed=manifest["training"]["seed"])
    assert not IDS & {p.id for ps in trained.values() for p in ps}
    assert [len(v) for v in load_sets(f"{FRESH_NAME}:2").values()] == [2, 2, 2]


def test_a_split_naming_a_prompt_the_sets_do_not_hold_is_refused(tmp_path):
    bad = tmp_path / "split.json"
    bad.write_text(json.dumps({**SPLIT, "sets": {"humaneval": ["HumanEval/9999"]}}))
    with pytest.raises(ConfigError, match="HumanEval/9999 is not in the installed humaneval set"):
        load_fresh(path=bad)
    with pytest.raises(ConfigError, match="sample size"):
        load_sets(f"{FRESH_NAME}:0")


def test_a_sweep_on_the_fresh_split_is_refused_before_anything_loads(capsys):
    from hispec.cli.main import FRESH_NAME as CLI_NAME
    from hispec.cli.main import main

    assert CLI_NAME == FRESH_NAME
    assert main(["bench", "--sweep", "layers", "--prompts", f"{FRESH_NAME}:2"]) == 2
    assert "nothing is chosen on heldout-fresh" in capsys.readouterr().err
