"""The fresh splits (issue 51, issue 57): report splits no development has touched. Their prompts are found
in the installed sets, belong to no other split and to no training, and no artifact under assets/, in the
working tree or anywhere in the git history, holds one of them (by id, former id or text) except the
reports each split's file lists: a tuning run committed on one fails here."""

import json
from pathlib import Path

import pytest
from fresh_split import committed_json, touching

from hispec.data.prompts import FRESH_NAME, FRESH_SPLITS, load_fresh, load_sets
from hispec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SPLITS = {name: json.loads(path.read_text(encoding="utf-8")) for name, path in FRESH_SPLITS.items()}
PROMPTS = {name: [p for ps in load_fresh(path=path).values() for p in ps] for name, path in FRESH_SPLITS.items()}
SIZES = {FRESH_NAME: 28, "heldout-fresh-2": 20}


def own(name: str) -> str:
    return str(FRESH_SPLITS[name].relative_to(ROOT))


def working_tree() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8", errors="replace"))
            for path in sorted((ROOT / "assets").rglob("*.json*"))]


@pytest.mark.parametrize("name", list(FRESH_SPLITS))
def test_no_artifact_but_the_listed_reports_holds_a_fresh_prompt_now_or_ever(name):
    assert touching(working_tree(), PROMPTS[name], SPLITS[name], own(name)) == []
    history = committed_json(ROOT)
    assert history, "the guard reads the git history of assets/: none found"
    assert touching(history, PROMPTS[name], SPLITS[name], own(name)) == []


def test_the_guard_catches_a_run_by_id_by_former_id_and_by_text_alone():
    split, prompts = SPLITS[FRESH_NAME], PROMPTS[FRESH_NAME]
    sample = prompts[-1]  # a summary: it has a former id too
    former = next(old for old, new in split["renamed"]["ids"].items() if new == sample.id)
    runs = [("assets/bench/by_id.json", json.dumps({"records": [{"prompt_id": sample.id}]})),
            ("assets/bench/by_former_id.json", json.dumps({"records": [{"prompt_id": former}]})),
            ("assets/bench/by_text.json", json.dumps({"prompts": [{"id": "renamed", "text": sample.text}]})),
            ("assets/bench/clean.json", json.dumps({"records": [{"prompt_id": "HumanEval/0"}]})),
            (own(FRESH_NAME), json.dumps(split))]
    assert touching(runs, prompts, split, own(FRESH_NAME)) == [
        "assets/bench/by_former_id.json", "assets/bench/by_id.json", "assets/bench/by_text.json"]
    assert touching(runs, prompts, {**split, "reported_in": ["assets/bench/by_id.json"]}, own(FRESH_NAME)) == [
        "assets/bench/by_former_id.json", "assets/bench/by_text.json"]
    # one split's file is not a licence for another's prompts
    assert touching(runs, prompts, split, own("heldout-fresh-2")) == [
        "assets/bench/by_former_id.json", "assets/bench/by_id.json", "assets/bench/by_text.json",
        own(FRESH_NAME)]


@pytest.mark.parametrize("name", list(FRESH_SPLITS))
def test_each_split_is_its_own_prompts_found_in_the_installed_sets(name):
    split = SPLITS[name]
    ids = {i for kind in split["sets"].values() for i in kind}
    sets = load_sets(name)
    assert split["name"] == name and set(sets) == {f"{name}-{kind}" for kind in split["sets"]}
    assert [p.id for kind in split["sets"] for p in sets[f"{name}-{kind}"]] == [
        i for kind in split["sets"].values() for i in kind]
    assert len(ids) == SIZES[name] and all(p.text.strip() for ps in sets.values() for p in ps)
    held = json.loads((ROOT / "assets/prompts/heldout_split.json").read_text())["sets"]
    assert not ids & {i for parts in held.values() for ids in parts.values() for i in ids}  # not tune, not report
    manifest = json.loads((ROOT / "assets/exits/smollm2-135m-instruct/manifest.json").read_text())
    trained = load_sets(manifest["training"]["prompt_spec"], seed=manifest["training"]["seed"])
    assert not ids & {p.id for ps in trained.values() for p in ps}
    others = {i for other, s in SPLITS.items() if other != name for kind in s["sets"].values() for i in kind}
    assert not ids & others  # no prompt in two fresh splits
    assert [len(v) for v in load_sets(f"{name}:2").values()] == [2] * len(split["sets"])


def test_a_split_naming_a_prompt_the_sets_do_not_hold_is_refused(tmp_path):
    bad = tmp_path / "split.json"
    bad.write_text(json.dumps({**SPLITS[FRESH_NAME], "sets": {"humaneval": ["HumanEval/9999"]}}))
    with pytest.raises(ConfigError, match="heldout-fresh: prompt HumanEval/9999 is not in the installed humaneval set"):
        load_fresh(path=bad)
    with pytest.raises(ConfigError, match="sample size"):
        load_sets(f"{FRESH_NAME}:0")
    with pytest.raises(ConfigError, match="is missing"):
        load_fresh(path=tmp_path / "none.json")


@pytest.mark.parametrize("name", list(FRESH_SPLITS))
def test_a_sweep_on_a_fresh_split_is_refused_before_anything_loads(capsys, name):
    from hispec.cli.main import FRESH_NAME as CLI_NAME
    from hispec.cli.main import main

    assert CLI_NAME == FRESH_NAME
    assert main(["bench", "--sweep", "layers", "--prompts", f"{name}:2"]) == 2
    assert f"nothing is chosen on {FRESH_NAME}" in capsys.readouterr().err
