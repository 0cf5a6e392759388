"""The adaptive policy's acceptance priors, measured in real generations (scripts/measure_priors.py).

The policy starts each generation from a prior per (proposer, judge) pair and moves towards what it
measures (engine.planning.policy.Acceptance). All of them are measured here, per token, in order up to each
block's first rejection (the policy's own estimate of a), in generations with fixed rounds on the
tuning split: a lookup copy by the full model, by n-gram length of the match ([lookup, full], every
match proposed whole); each exit's drafts by the full model ([exit, full]); exit d's drafts by exit v
([d, v, full]). Heads without such figures (ones a user trained) fall back on their manifest's
held-out agreement, which for the shipped heads was measured on all the held-out prompts, the report
split included.

Measure on the tuning split only (bench --prompts heldout-tune): the report split and the
summarisation set must stay untouched by anything that sets a default.
"""

from __future__ import annotations

from dataclasses import replace

from hispec.engine.config import DecodeConfig, preset
from hispec.runs.runner import decoder_for
from hispec.text import Detokenizer

def _configs(lm, formats: tuple[str, ...] = (), exact: bool = True, full_only: bool = False) -> dict[str, DecodeConfig]:
    """[lookup, full]; [exit d, full] and [exit v, full]; [exit d, exit v, full], at the model's defaults;
    for each cheaper format P in `formats` (levels are (depth, precision)): [full@P, full], [d@P, full],
    [v@P, full] (each judged by the exact model) and [d@P, full@P, full], [v@P, full@P, full] (exits
    judged by the whole model in that format). `exact=False` leaves out the exact-format runs; `full_only`
    keeps only [full@P, full] of each format (the level the 3-level plans put in the middle)."""
    own = preset("hispec", policy="fixed").resolve_for(lm.ee)
    d, v = own.exit_layer("draft"), own.exit_layer("verify")
    one = lambda *levels: DecodeConfig(levels=levels, policy="fixed", lengths=(1, 1))  # noqa: E731
    configs = {"lookup": preset("lookup", policy="fixed"),
               f"exit {d}": one(d), f"exit {v}": one(v), f"exits {d}, {v}": one(d, v)} if exact else {}
    for p in formats:
        if full_only:
            configs[f"full@{p}"] = one(f"full@{p}")
            continue
        configs.update({f"full@{p}": one(f"full@{p}"), f"exit {d}@{p}": one(f"{d}@{p}"), f"exit {v}@{p}": one(f"{v}@{p}"),
                        f"exit {d}@{p}, full@{p}": one(f"{d}@{p}", f"full@{p}"),
                        f"exit {v}@{p}, full@{p}": one(f"{v}@{p}", f"full@{p}")})
    return configs


def measure(lm, sets: dict, max_new_tokens: int = 128, progress=None, formats: tuple[str, ...] = (),
            exact: bool = True, full_only: bool = False) -> dict:
    """Per run and (holder, judge) pair: tokens accepted and judged, in order up to each block's first
    rejection, over every prompt of `sets`; and the rates. Lookup holders are 'lookup:N' (N: the
    n-gram length of the match that proposed the token). `formats`, `exact`: see `_configs`."""
    configs = _configs(lm, formats, exact, full_only)
    counts: dict[str, dict[str, list[int]]] = {name: {} for name in configs}
    detok = Detokenizer(lm.tokenizer)
    prompts = [(s, p) for s, ps in sets.items() for p in ps]
    for i, (set_name, p) in enumerate(prompts):
        ids = lm.encode(p.text, chat=p.chat)
        for name, config in configs.items():
            decoder = decoder_for(lm, ids, replace(config, max_new_tokens=max_new_tokens), detok=detok)
            pairs = counts[name]

            def record(holder: str, judge: str, accepted: bool, pairs=pairs) -> None:
                pair = pairs.setdefault(f"{holder}->{judge}", [0, 0])
                pair[0] += accepted
                pair[1] += 1

            decoder.policy.observe = record  # the fixed policy ignores what it observes; count it instead
            for _ in decoder.events():
                pass
        if progress:
            progress(i + 1, len(prompts), f"{set_name}/{p.id}")
    rates = {name: {k: {"accepted": ok, "judged": n, "rate": round(ok / n, 4) if n else None}
                    for k, (ok, n) in sorted(pairs.items())} for name, pairs in counts.items()}
    return {"runs": {name: {"levels": list(c.resolve_for(lm.ee).levels)} for name, c in configs.items()},
            "max_new_tokens": max_new_tokens, "prompts": {s: [p.id for p in ps] for s, ps in sets.items()},
            "acceptance": rates}


def lookup_priors(measured: dict) -> dict[str, float]:
    """The lookup level's priors for the policy: 'lookup:N' -> per-token acceptance by the full model."""
    out = {}
    for key, v in (measured["acceptance"].get("lookup") or {}).items():
        holder, _, judge = key.partition("->")
        if holder.startswith("lookup:") and judge == "target" and v["rate"] is not None:
            out[holder] = v["rate"]
    return out


def exit_priors(measured: dict) -> dict[str, float]:
    """The exits' priors for the policy: 'D-target' (exit D's drafts judged by the full model, from the
    [exit D, full] runs) and 'D-V' (exit D's drafts judged by exit V, from the [exit D, exit V, full] run);
    levels in a cheaper format by their spec: 'full@q4-target', '2@q4-target', '2@q4-full@q4'."""
    out = {}
    for name, run in measured["runs"].items():
        layers = [x for x in run["levels"] if x != "lookup"]
        pairs = measured["acceptance"][name]
        if len(layers) == 1 and (pairs.get("draft->target") or {}).get("rate") is not None:
            out[f"{layers[0]}-target"] = pairs["draft->target"]["rate"]
        elif len(layers) == 2 and (pairs.get("draft->verify") or {}).get("rate") is not None:
            out[f"{layers[0]}-{layers[1]}"] = pairs["draft->verify"]["rate"]
    return out
