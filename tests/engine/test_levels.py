"""Levels as data: one decode loop for every level list, the lookup level, and the adaptive policy."""

import pytest
from helpers import ee_of, hf_greedy, identity_layer_model, tiny_model

from hispec.engine.planning.costs import CostModel
from hispec.engine.config import DecodeConfig, preset
from hispec.engine.decoding import Decoder
from hispec.errors import ConfigError
from hispec.engine.events import PolicyEvent, TokenEvent, TokenState
from hispec.engine.levels import build_levels, parse_levels
from hispec.engine.lookup import LookupIndex
from hispec.engine.planning.policy import AutoPolicy
from hispec.engine.planning.round import expected_run
from hispec.runs.runner import run

LISTS = [(), ("lookup",), (3,), (2, 5), ("lookup", 4), ("lookup", 2, 5), ("lookup", 1, 7)]
PROMPTS = [[5, 17, 33, 5, 17, 33, 5, 9, 41], [70]]


# ---- level lists -----------------------------------------------------------------------------
def test_parse_levels_accepts_the_spellings_and_implies_the_full_model():
    assert parse_levels("lookup,2,4") == ("lookup", 2, 4)
    assert parse_levels("lookup, exit2, exit 4, full") == ("lookup", 2, 4)
    assert parse_levels(("lookup", 4)) == ("lookup", 4)
    assert parse_levels("full") == ()


@pytest.mark.parametrize("spec, message", [
    ("2,lookup", "at the bottom"),
    ("lookup,lookup,2", "once"),
    ("4,2", "must increase"),
    ("2,2", "must increase"),
    ("2,4,6", "at most two exit levels"),
    ("medusa", "unknown level 'medusa'"),
])
def test_bad_level_lists_are_refused_with_what_is_allowed(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_levels(spec)


def test_exit_layers_are_checked_against_the_model():
    with pytest.raises(ConfigError, match="exit layer 8 is impossible: this model has 8 layers"):
        build_levels((2, 8), 8)
    with pytest.raises(ConfigError, match="exit layer 8 is impossible"):
        Decoder(ee_of(tiny_model(layers=8)), [1, 2], DecodeConfig(levels=("lookup", 8)))


def test_levels_carry_the_role_names_of_the_presets():
    names = lambda spec: [level.name for level in build_levels(spec, 8)]  # noqa: E731
    assert names(()) == ["target"]
    assert names((4,)) == ["draft", "target"]
    assert names((2, 4)) == ["draft", "verify", "target"]
    assert names(("lookup",)) == ["lookup", "target"]
    assert names(("lookup", 4)) == ["lookup", "verify", "target"]
    assert names(("lookup", 2, 4)) == ["lookup", "draft", "verify", "target"]


def test_presets_resolve_to_their_level_lists():
    resolve = lambda **kw: preset(**{"policy": "fixed", **kw}).resolve(8).levels  # noqa: E731
    assert resolve(method="autoregressive") == ()
    assert resolve(method="layerskip") == (2,)
    assert resolve(method="hispec") == (1, 2)
    assert resolve(method="hispec", policy="auto") == ("lookup", 1, 2)
    assert resolve(method="lookup") == ("lookup",)
    assert resolve(method="hispec", levels="lookup,3,6") == ("lookup", 3, 6)


def test_unknown_policy_is_refused():
    with pytest.raises(ConfigError, match="unknown policy 'smart'; choose from fixed, auto"):
        DecodeConfig(policy="smart").validate()


# ---- exactness -------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral"])
def arch_model(request):
    return tiny_model(request.param, seed=3)


@pytest.mark.parametrize("policy", ["fixed", "auto"])
@pytest.mark.parametrize("levels", LISTS, ids=lambda spec: "+".join(map(str, spec)) or "full")
def test_every_level_list_and_policy_equals_generate(arch_model, levels, policy):
    ee = ee_of(arch_model)
    for prompt in PROMPTS:
        ref = hf_greedy(arch_model, prompt, 30)
        result = run(ee, prompt, DecodeConfig(levels=levels, policy=policy, max_new_tokens=30, lookup_len=4, lengths=(2, 3)))
        assert result.token_ids == ref, (levels, policy, prompt)


# ---- the lookup level --------------------------------------------------------------------------
def test_lookup_proposes_what_followed_the_most_recent_longest_match():
    index = LookupIndex(max_ngram=3)
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3]
    index.extend(tokens, len(tokens))
    # "2 3" last occurred at positions 5-6 (followed by 8, 7, ...); the 3-gram "7 2 3" never did
    assert index.propose(tokens, 4) == ([8, 7, 2, 3], 2)
    assert index.propose(tokens, 1) == ([8], 2)
    assert index.propose(tokens + [42], 4) == ([], 0)


def test_lookup_never_reads_uncommitted_occurrences():
    index = LookupIndex(max_ngram=2)
    tokens = [4, 5, 6, 4, 5]
    index.extend(tokens, 2)  # only positions 0-1 committed: nothing ends before a committed token yet
    assert index.propose(tokens, 3) == ([5], 1) or index.propose(tokens, 3)[0] == []
    index.extend(tokens, 5)
    assert index.propose(tokens, 3) == ([6, 4, 5], 2)


def test_lookup_level_runs_no_layers_and_copies_a_cycle():
    """On a model whose next token depends only on the current one, the output cycles and the
    lookup level copies the cycle: most tokens come from it, with few full-model passes."""
    model = identity_layer_model()
    ee = ee_of(model)
    prompt = [5, 9, 14]
    ref = hf_greedy(model, prompt, 60)
    r = run(ee, prompt, preset("lookup", max_new_tokens=60, lookup_len=8))
    assert r.token_ids == ref
    copied = [t for t in r.trace if t.css_class == "copied"]
    assert len(copied) > 30
    assert r.stats["full_passes"] < 25
    assert "lookup" not in r.stats["layer_tokens"]["by_stage"]  # copies cost no layers
    assert r.stats["acceptance"]["lookup->target"] > 0.8


def test_lookup_tokens_are_judged_by_the_exit_above_it():
    model = tiny_model("llama", seed=5)
    ee = ee_of(model)
    events = list(Decoder(ee, PROMPTS[0], DecodeConfig(levels=("lookup", 4), max_new_tokens=30,
                                                        lookup_len=4, policy="fixed", lengths=(None, 2))).events())
    copied = {e.serial for e in events if isinstance(e, TokenEvent) and e.origin == "lookup"}
    assert copied
    judged = [e for e in events if isinstance(e, TokenEvent) and e.serial in copied
              and e.state in (TokenState.TENTATIVE, TokenState.VERIFY_REJECTED)]
    assert judged and all(e.stage == "verify" for e in judged)


# ---- the adaptive policy -------------------------------------------------------------------------
def _flat_costs(layer=1e-3, head=1e-4, grow=0.0):
    """A cost model where a pass costs `layer` per layer, plus `grow` per extra token."""
    costs = CostModel()
    for n in (1, 2, 4, 8, 16):
        costs.observe_pass(1, n, layer * (1 + grow * (n - 1)), weight=1.0)
        for e in (2, 4, 8):
            costs.observe_head(e, n, head, weight=1.0)
    return costs


def test_expected_run_is_the_geometric_sum():
    assert expected_run(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_run(1.0, 4) == 4 and expected_run(0.0, 4) == 0 and expected_run(0.7, 0) == 0


def test_auto_takes_a_long_copy_when_copies_are_accepted_and_verification_is_cheap():
    levels = build_levels(("lookup", 2, 4), 8)
    policy = AutoPolicy(levels, _flat_costs(grow=0.02), {}, lookup_len=8)
    for _ in range(20):
        policy.observe("lookup:2", "target", True)
    plan = policy.plan(room=50, pending=0, match=([1, 2, 3, 4, 5, 6], 2))
    assert plan.choice == "lookup 6" and plan.round.judges == () and plan.tokens == (1, 2, 3, 4, 5, 6)
    assert plan.estimates["lookup 6"] > plan.estimates["plain"]


def test_auto_falls_back_to_plain_steps_when_nothing_pays():
    levels = build_levels(("lookup", 2, 4), 8)
    policy = AutoPolicy(levels, _flat_costs(grow=0.5), {}, lookup_len=8)
    for holder in ("lookup:1", "draft", "verify"):
        for _ in range(30):
            policy.observe(holder, "target", False)
    for _ in range(30):
        policy.observe("draft", "verify", False)
    plan = policy.plan(room=50, pending=0, match=([7, 7], 1))
    assert plan.choice == "plain" and plan.round.count == 0 and "plain step" in plan.reason


def test_auto_piles_tentative_tokens_up_when_the_verifier_is_trusted():
    """A cheap drafter (exit 2 of 32) the verifier mostly accepts, a deep verifier (exit 16) the full
    model always accepts, and passes that cost the same for any number of tokens: drafting at the
    verifier itself costs 16 layers a token, so the hierarchy wins, and piling tentative tokens up
    over two rounds before one full pass beats a full pass every round."""
    levels = build_levels((2, 16), 32)
    policy = AutoPolicy(levels, _flat_costs(head=0.0), {("draft", "verify"): 0.9, ("verify", "target"): 1.0,
                                                        ("draft", "target"): 0.0}, lookup_len=8)
    plan = policy.plan(room=50, pending=0, match=([], 0))
    assert plan.round.judges == (levels[1],) and plan.round.verify_at > 1, plan
    # while tentative tokens pile up, the plan holds until the full model runs
    assert policy.plan(room=40, pending=2, match=([], 0)) == plan


def test_auto_says_what_it_chose_every_round_and_stats_count_it():
    model = identity_layer_model()
    ee = ee_of(model)
    decoder = Decoder(ee, [5, 9, 14], preset("hispec", policy="auto", max_new_tokens=40))
    events = list(decoder.events())
    plans = [e for e in events if isinstance(e, PolicyEvent)]
    assert len(plans) == decoder.ledger.round and all(p.reason and "plain" in p.estimates for p in plans)
    r = run(ee, [5, 9, 14], preset("hispec", policy="auto", max_new_tokens=40))
    assert sum(r.stats["policy_choices"].values()) == r.stats["rounds"]
    assert r.settings["policy"] == "auto" and r.settings["levels"] == ("lookup", 1, 2)


def test_cost_model_interpolates_what_it_measured():
    costs = CostModel()
    costs.observe_pass(10, 1, 0.010, weight=1.0)  # 1 ms per layer for one token
    costs.observe_pass(10, 4, 0.020, weight=1.0)  # 2 ms per layer for four
    assert costs.layer(1) == pytest.approx(1e-3) and costs.layer(4) == pytest.approx(2e-3)
    assert costs.layer(2) == pytest.approx(1e-3 + (2e-3 - 1e-3) / 3)
    assert costs.layer(8) == pytest.approx(4e-3)  # beyond the largest measured size: linear in tokens
    costs.observe_pass(10, 1, 0.030)  # a slower pass moves the estimate by the moving average's weight
    assert costs.layer(1) == pytest.approx(0.9e-3 + 0.1 * 3e-3)
    assert costs.head(4, 1) == 0.0  # an unmeasured head costs nothing in the model


def test_summarize_set_is_real_documents_with_their_source():
    from hispec.data.prompts import load_sets

    docs = load_sets("summarize")["summarize"]
    assert len(docs) >= 20
    for doc in docs:
        assert doc.id.startswith(("summarize-pydoc-", "summarize-readme-"))
        assert doc.text.startswith("Summarize the following text") and len(doc.text.split()) >= 150


def test_seeded_sampling_runs_fixed_rounds_so_that_it_is_reproducible():
    config = preset("hispec", policy="auto", temperature=0.8, seed=3).resolve(8)
    assert config.policy == "fixed" and config.levels == (1, 2)
    assert preset("hispec", policy="auto", temperature=0.8).resolve(8).policy == "auto"
    assert preset("hispec", policy="auto", seed=3).resolve(8).policy == "auto"  # greedy: exact anyway


def test_levels_in_words_and_a_compare_row_says_what_ran_in_them():
    """Seen on the page: Compare's row read 'lookup → exit full@q4 → full model'."""
    from hispec.engine.config import DecodeConfig
    from hispec.engine.levels import level_words
    from hispec.evaluation.compare import what_ran

    assert [level_words(x) for x in ("lookup", 4, "exit 4", "full@q4", "4@q4", "full@a8")] == [
        "lookup", "exit 4", "exit 4", "the 4-bit full model", "exit 4 in 4-bit", "the 4-bit, int8-activation full model"]
    assert what_ran(DecodeConfig(levels=("lookup", "full@q4"))).startswith("lookup → 4-bit full model → full model;")
    assert what_ran(DecodeConfig(levels=(2, 4), policy="fixed", lengths=(2, 4))) == \
        "exit 2 → exit 4 → full model; fixed rounds, 2 drafts per round, the full model at 4 tentative"
