"""A bench method is a value with one grammar (hispec/evaluation/method.py): BenchMethod.parse reads what a
person types and what a report keys its records by; .key writes it back, the same string."""

import json
import re
from pathlib import Path

import pytest

from hispec.errors import ConfigError
from hispec.evaluation import peers
from hispec.evaluation.method import BenchMethod

ROOT = Path(__file__).resolve().parents[2]


def shipped_keys() -> set[str]:
    """Every method key of the shipped reports: their method lists, their records, their summaries."""
    keys = set()
    for path in (ROOT / "assets" / "bench").glob("*.json"):
        report = json.loads(path.read_text())
        keys.update(report.get("methods") or ())
        keys.update(r["method"] for r in report.get("records") or () if isinstance(r, dict) and "method" in r)
        for part in (report.get("summary") or {}).values():
            if isinstance(part, dict) and isinstance(part.get("methods"), dict):
                keys.update(part["methods"])
    return keys


def test_every_shipped_key_reads_back_as_itself():
    keys = shipped_keys()
    assert len(keys) >= 30 and {"lookup+full@a8/auto@q4", "llamacpp_lookup:4", "2/fixed"} <= keys
    for key in sorted(keys):
        method = BenchMethod.parse(key)
        assert method.key == key and method.spelling == "", key  # written back from its parts, not kept as typed
        assert BenchMethod.parse(method.key) == method


# The five rules that tell the weights' '@' from a level's precision (the former bench.split_weights):
# (text, name, policy, weights, levels)
RULES = [
    # 1. after a policy: the weights
    ("lookup+4/auto@q4", "lookup+4", "auto", "q4", ("lookup", 4)),
    ("hispec/auto@q4", "hispec", "auto", "q4", None),
    ("full@q4/auto@fp32", "full@q4", "auto", "fp32", ("full@q4",)),
    # 2. after a method or peer name: the weights
    ("autoregressive@fp32", "autoregressive", None, "fp32", None),
    ("hispec@q4", "hispec", None, "q4", None),
    ("hf_lookup@q4", "hf_lookup", None, "q4", None),
    # 3. after a level that has its precision: the weights
    ("full@q4@fp32", "full@q4", None, "fp32", ("full@q4",)),
    # 4. fp32, never a level's precision: the weights
    ("lookup+4@fp32", "lookup+4", None, "fp32", ("lookup", 4)),
    # 5. otherwise a level's precision, no weights
    ("lookup+4@q4", "lookup+4@q4", None, None, ("lookup", "4@q4")),  # exit 4 in 4-bit under the float32 model
    ("full@q4", "full@q4", None, None, ("full@q4",)),
    ("lookup+full@q4/auto", "lookup+full@q4", "auto", None, ("lookup", "full@q4")),  # '/' after the '@'
    ("lookup+4@q4+full", "lookup+4@q4+full", None, None, ("lookup", "4@q4")),  # '+' after the '@'
]
# Rule 3 looks at the whole text before the last '@': '2@q4+full@q4' is exit 2 in 4-bit on the 4-bit weights,
# not the 4-bit full model above it (as the bench read it before the grammar was typed; write 2@q4+full@q4/auto
# for the levels)
RULES.append(("2@q4+full@q4", "2@q4+full", None, "q4", ("2@q4",)))


@pytest.mark.parametrize("text, name, policy, weights, levels", RULES)
def test_the_weights_tag_and_a_levels_precision_are_told_apart(text, name, policy, weights, levels):
    method = BenchMethod.parse(text)
    assert (method.name, method.policy, method.weights, method.levels) == (name, policy, weights, levels)
    assert method.key == text


def test_ours_and_peers():
    ours, plain, peer = BenchMethod.parse("lookup+2+4/fixed"), BenchMethod.parse("autoregressive@q4"), \
        BenchMethod.parse("llamacpp_lookup:4")
    assert (ours.method, ours.peer, ours.on_weights) == ("hispec", None, True)
    assert plain == BenchMethod.plain("q4") and BenchMethod.plain().key == "autoregressive"
    assert (peer.method, peer.peer, peer.count, peer.on_weights) == (None, peers.PEERS["llamacpp_lookup"], 4, False)
    assert BenchMethod.parse("llamacpp_lookup").count == 10  # its default
    assert BenchMethod.parse("hf_generate").on_weights


def test_a_method_on_weights():
    """One method per format (bench --weights fp32,q4): a level list without a policy gets the run's before
    the tag, so that the tag reads back as the weights and not as a level's precision."""
    assert BenchMethod.parse("lookup+4").on("q4", "auto").key == "lookup+4/auto@q4"
    assert BenchMethod.parse("lookup+4/fixed").on("q4", "auto").key == "lookup+4/fixed@q4"
    assert BenchMethod.parse("hispec").on("q4", "auto").key == "hispec@q4"
    assert BenchMethod.parse("hf_generate").on("fp32", "auto").key == "hf_generate@fp32"
    on = BenchMethod.parse("lookup+4").on("q4", "auto")
    assert BenchMethod.parse(on.key) == on


def test_a_key_keeps_what_was_typed():
    """Text the grammar reads but would write otherwise keeps its spelling as the key (the reports did)."""
    for text, policy in (("hispec/", None), ("hispec/ auto", "auto"), (" lookup+4", None)):
        method = BenchMethod.parse(text)
        assert (method.key, method.policy) == (text, policy)
    assert BenchMethod.parse("hispec/").on("q4", "auto").key == "hispec/@q4"
    assert BenchMethod.parse(" lookup+4").on("q4", "auto").key == " lookup+4/auto@q4"


ERRORS = [
    ("hispec/auto@int3", "'hispec/auto@int3': the weights after @ are fp32, q4, a8"),
    ("medusa", "unknown benchmark method 'medusa'; choose from autoregressive, hf_generate, hf_early_exit, "
               "hf_lookup, layerskip, lookup, hispec (ours optionally with /fixed or /auto), or a level list such "
               "as lookup+2+4"),
    ("hf_generate/auto", "unknown benchmark method 'hf_generate/auto'; choose from"),
    ("hispec/slow", "unknown policy 'slow' in 'hispec/slow'; write METHOD/fixed or METHOD/auto"),
    ("full@q8/auto", "unknown precision 'q8' in level 'full@q8': choose from q4, a8"),
    ("lookup+4+2", "exit layers must increase from the bottom level up (got 4, 2)"),
    ("llamacpp@q4", "'llamacpp@q4': llamacpp runs its own file, whatever the weights; write it without @"),
    ("hf_generate:3", "'hf_generate:3': hf_generate takes no count after ':'"),
    ("llamacpp_lookup:65", "'llamacpp_lookup:65': llamacpp_lookup:N takes a whole number from 1 to 64"),
    ("llamacpp_lookup:x", "'llamacpp_lookup:x': llamacpp_lookup:N takes a whole number from 1 to 64"),
]


@pytest.mark.parametrize("text, message", ERRORS)
def test_what_is_wrong_and_what_is_allowed(text, message):
    with pytest.raises(ConfigError) as refused:
        BenchMethod.parse(text)
    assert str(refused.value).startswith(message)


def test_generate_takes_ours_without_weights():
    """generate's --method: ours only, '@' always a level's precision (its own messages)."""
    assert BenchMethod.parse_ours("hispec/fixed") == BenchMethod("hispec", "fixed", method="hispec")
    spec = BenchMethod.parse_ours("lookup+2+4/auto")
    assert (spec.method, spec.levels, spec.policy) == ("hispec", ("lookup", 2, 4), "auto")
    with pytest.raises(ConfigError, match="unknown policy 'fast'"):
        BenchMethod.parse_ours("hispec/fast")
    with pytest.raises(ConfigError, match="unknown method 'eagle'; choose from autoregressive, layerskip, hispec, "
                                          "lookup, optionally with /fixed or /auto"):
        BenchMethod.parse_ours("eagle")
    with pytest.raises(ConfigError, match="unknown level 'hispec@q4'"):
        BenchMethod.parse_ours("hispec@q4")


def test_the_grammar_is_read_in_one_place():
    """No other module takes a method's text apart at its '@' or defines a second reader of it."""
    pattern = re.compile(r"def (split_weights|parse_method|is_peer)\b|partition\(\"@\"\)\[2\]|rpartition\(\"@\"\)\[")
    found = [str(p.relative_to(ROOT)) for folder in ("hispec", "ui", "scripts") for p in (ROOT / folder).rglob("*.py")
             if pattern.search(p.read_text())]
    assert found == []
