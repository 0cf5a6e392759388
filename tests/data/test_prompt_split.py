"""The held-out prompts' tuning and report splits (issue 29, item 2): made once by a rule, shipped,
and used by name in --prompts."""

import pytest

from hispec.errors import ConfigError
from hispec.data.prompts import Prompt, SPLIT_RULE, apply_split, load_split, make_split, split_ids


def test_the_shipped_split_follows_its_rule():
    split = load_split()
    assert split["rule"] == SPLIT_RULE
    for name, parts in split["sets"].items():
        tune, report = parts["tune"], parts["report"]
        assert not set(tune) & set(report) and len(tune) == (len(tune) + len(report)) // 2
        # the rule applied to the set's ids (in either order) gives the shipped split again
        assert split_ids(tune + report) == {"tune": tune, "report": report}
        assert {k: set(v) for k, v in split_ids(report + tune).items()} == {"tune": set(tune), "report": set(report)}
        assert split["sizes"][name] == {"tune": len(tune), "report": len(report)}
    assert set(split["sets"]) == {"heldout-sharegpt", "heldout-mtbench", "heldout-humaneval"}
    assert all(len(p["report"]) >= 4 for p in split["sets"].values())  # the headline draws 4 per set


def test_a_split_by_hash_is_independent_of_order_and_balanced():
    ids = [f"p{i}" for i in range(11)]
    a, b = split_ids(ids), split_ids(ids[::-1])
    assert set(a["tune"]) == set(b["tune"]) and len(a["tune"]) == 5 and len(a["report"]) == 6


def test_apply_split_names_the_sets_and_refuses_a_stale_split():
    held = {"heldout-x": [Prompt(f"x{i}", "t") for i in range(4)], "heldout-y": [Prompt("y0", "t"), Prompt("y1", "t")]}
    split = make_split(held)
    tune, report = apply_split(held, "tune", split), apply_split(held, "report", split)
    assert list(tune) == ["heldout-tune-x", "heldout-tune-y"] and list(report) == ["heldout-report-x", "heldout-report-y"]
    for kind in ("x", "y"):
        ids = {p.id for p in tune[f"heldout-tune-{kind}"]} | {p.id for p in report[f"heldout-report-{kind}"]}
        assert ids == {p.id for p in held[f"heldout-{kind}"]}
        assert not {p.id for p in tune[f"heldout-tune-{kind}"]} & {p.id for p in report[f"heldout-report-{kind}"]}
    with pytest.raises(ConfigError, match="x9 of heldout-x is in neither split"):
        apply_split({"heldout-x": [Prompt("x9", "t")]}, "tune", split)
    with pytest.raises(ConfigError, match="unknown split 'test'"):
        apply_split(held, "test", split)


def test_bad_heldout_specs_are_refused(capsys):
    from hispec.cli.main import main

    assert main(["bench", "--prompts", "heldout-tune:x", "--methods", "autoregressive"]) == 2
    assert "'heldout-tune:x': write heldout-tune or heldout-tune:N" in capsys.readouterr().err


@pytest.mark.real_model
def test_the_default_heads_heldout_prompts_are_all_in_the_split():
    from hispec.model.loading import load_model
    from hispec.training.heads.prompts import heldout_prompts

    held = heldout_prompts(load_model("default"))
    split = load_split()
    assert {k: {p.id for p in v} for k, v in held.items()} == {
        k: set(v["tune"]) | set(v["report"]) for k, v in split["sets"].items()}
    for which in ("tune", "report"):
        sets = apply_split(held, which)
        assert {k: [p.id for p in v] for k, v in sets.items()} == {
            f"heldout-{which}-{k.removeprefix('heldout-')}": v[which] for k, v in split["sets"].items()}
