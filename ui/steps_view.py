"""One replayed round (hispec.runs.replay) as numbered steps a student can follow.

Tokens are coloured chips with the classes of ui/render.py (COLORS, the trace's LEGEND); model
text is always escaped and shown with control characters made visible. Styles: assets/steps.css.
"""

from __future__ import annotations

import html

from hispec.engine.levels import levels_by_role
from hispec.text import printable
from ui.labels import level_words

_SEP = " · "


def round_label(rounds: list[dict], i: int) -> str:
    """'Round 3 of 17' (the prefill is 'Prefill (round 0 of 17)'); '' when there is nothing to replay."""
    if not rounds:
        return ""
    i = min(max(i, 0), len(rounds) - 1)
    total = max((r["round"] for r in rounds), default=0)
    r = rounds[i]["round"]
    return f"Prefill (round 0 of {total})" if r == 0 else f"Round {r} of {total}"


def _chip_class(token: dict, kind: str, cheap: frozenset = frozenset()) -> str:
    """The display class of a token in one of a step's lists (classes of ui/render.COLORS); `cheap`: the
    roles held by a level in a cheaper format (their accepted drafts are the 4-bit model's, as in the text)."""
    state = token["state"]
    if kind == "proposed":
        return "drafted"
    if kind == "kept":
        return "tentative"
    if kind == "discarded":
        return "discarded"
    if kind == "rejected":
        return "verify-rejected" if state == "verify_rejected" else "target-rejected"
    if state == "verify_wrote":
        return "verify-wrote"
    if state == "target_wrote":
        return "target-wrote"
    # accepted by the full model: coloured by how it entered the sequence, as in the trace
    if token.get("born") == "verify_wrote":
        return "verify-wrote"
    if token.get("origin") in cheap:
        return "precision"
    return "copied" if token.get("origin") == "lookup" else "accepted"


def _chip(token: dict, kind: str, cheap: frozenset = frozenset()) -> str:
    text = html.escape(printable(token["text"]), quote=True)
    title = html.escape(f"token {token['index'] + 1} · id {token['token_id']} · {token['state'].replace('_', ' ')}"
                        f" · written by {token['origin']}", quote=True)
    return f'<span class="hs-tok hs-{_chip_class(token, kind, cheap)}" title="{title}">{text}</span>'


def _chips(tokens: list[dict], kind: str, cheap: frozenset = frozenset()) -> str:
    return " ".join(_chip(t, kind, cheap) for t in tokens)


def _layers(start: int, end: int) -> str:
    """Layers [start, end) in the 1-based words of the page: 'layers 1–4', 'layer 5'."""
    return f"layer {end}" if end - start == 1 else f"layers {start + 1}–{end}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _number(k: int) -> str:
    return chr(0x2460 + k - 1) if 1 <= k <= 20 else f"({k})"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _work(step: dict, head: str = "exit head") -> str:
    """What the step's passes ran, in words; `head`: what ends the level's layers (a full model in a
    cheaper format ends at its own LM head, not at an exit head)."""
    passes = step["passes"]
    if not passes:
        return "no layers run"
    if step["stage"] == "draft":
        lo, hi = step["layers"]
        sizes = [p["tokens"] for p in passes if p["stage"] == step["level"]] or [p["tokens"] for p in passes]
        runs = f"{len(sizes)}×" if len(sizes) > 1 else "once"
        each = "each" if len(sizes) > 1 else ""
        on = (f"on {_plural(sizes[0], 'token')} {each}".rstrip() if len(set(sizes)) == 1
              else "on " + ", ".join(map(str, sizes)) + " tokens")
        return f"{_layers(lo, hi)} + {head} ran {runs} {on}"
    # Merge adjacent passes over the same tokens: 'layers 5–8 on 2 tokens' (catch-ups listed apart).
    parts: list[list[int]] = []
    for p in passes:
        start, end = p["layers"]
        if parts and parts[-1][1] == start and parts[-1][2] == p["tokens"]:
            parts[-1][1] = end
        else:
            parts.append([start, end, p["tokens"]])
    words = [f"{_layers(s, e)} on {_plural(n, 'token')}" for s, e, n in parts]
    if step["stage"] == "verify":  # the judging level's own layers end at its exit head
        s, e, n = parts[-1]
        words[-1] = f"{_layers(s, e)} + {head} on {_plural(n, 'token')}"
    if len(words) > 1:
        return f"{words[-1]} (after {', '.join(words[:-1])} to catch up)"
    return words[0]


def _outcome(step: dict, cheap: frozenset = frozenset()) -> str:
    """What the step decided: chips after words."""
    stage, out = step["stage"], []
    if step["proposed"]:
        out.append(f"proposed {_chips(step['proposed'], 'proposed')}")
    if step["kept"]:
        out.append(f"kept {_chips(step['kept'], 'kept')}")
    if stage in ("target", "prefill"):
        wrote = {t["serial"] for t in step["wrote"]}
        accepted = [t for t in step["committed"] if t["serial"] not in wrote]
        if accepted:
            out.append(f"committed {_chips(accepted, 'committed', cheap)}")
        if step["rejected"]:
            out.append(f"rejected {_chips(step['rejected'], 'rejected')}")
        if step["wrote"]:
            how = ("wrote its own" if step["rejected"] else "wrote bonus" if accepted
                   else "wrote the first token" if stage == "prefill" else "wrote")
            out.append(f"{how} {_chips(step['wrote'], 'wrote')}")
    else:
        if step["rejected"]:
            out.append(f"rejected {_chips(step['rejected'], 'rejected')}")
        if step["wrote"]:
            out.append(f"wrote {_chips(step['wrote'], 'wrote')}")
    if step["discarded"]:
        why = " (never committed)" if stage == "stop" else ""
        out.append(f"discarded {_chips(step['discarded'], 'discarded')}{why}")
    return ", ".join(out)


def _step_name(step: dict, roles: dict[str, int]) -> str:
    stage, exit_layer = step["stage"], step.get("exit")
    if stage in ("draft", "verify"):
        level = roles.get(step.get("level") or stage)
        name = "Draft" if stage == "draft" else "Intermediate verify"
        if isinstance(level, str) and "@" in level:  # a level in a cheaper format, by what it did: 'Judged by
            return f"{'Draft' if stage == 'draft' else 'Judged'} by {level_words(level)}"  # the 4-bit full model'

        layer = exit_layer or level
        return f"{name} at exit {layer}" if layer else name
    return {"prefill": "Prefill", "lookup": "Lookup", "target": "Full model", "stop": "Stopped"}.get(
        stage, step.get("title", stage))


def _step_html(k: int, step: dict, roles: dict[str, int]) -> str:
    name = html.escape(_step_name(step, roles))
    if step["stage"] == "lookup":
        work = "copied from earlier text, no layers run"
    elif step["stage"] == "stop":
        work = "Stop pressed inside the round"
    else:
        level = roles.get(step.get("level") or step["stage"])
        head = "LM head" if str(level).startswith("full@") else "exit head"
        work = f"{_work(step, head)}, {_ms(step['seconds'])}"
    cheap = frozenset(role for role, level in roles.items() if "@" in str(level))
    outcome = _outcome(step, cheap)
    dash = f" — {outcome}" if outcome else ""
    hue = "precision" if step.get("level") in cheap and step["stage"] in ("draft", "verify") else step["stage"]
    return (f'<li class="hs-step hs-step-{html.escape(step["stage"])} hs-step-{html.escape(hue)}">'
            f'<span class="hs-step-num">{_number(k)}</span> '
            f'<b>{name}</b>: {html.escape(work)}{dash}</li>')


def _runs(before: list[int], after: list[int]) -> list[tuple[int, int, int, int]]:
    """Runs of consecutive layers with the same (before, after): (first, last, before, after), 0-based."""
    out: list[tuple[int, int, int, int]] = []
    for layer, (b, a) in enumerate(zip(before, after, strict=False)):
        if out and out[-1][2:] == (b, a):
            out[-1] = (out[-1][0], layer, b, a)
        else:
            out.append((layer, layer, b, a))
    return out


def cache_table_html(before: list[int], after: list[int]) -> str:
    """'KV cache length per layer: before → after', runs of equal layers compressed."""
    rows = []
    for first, last, b, a in _runs(before, after):
        layers = f"layer {first + 1}" if first == last else f"layers {first + 1}–{last + 1}"
        delta = a - b
        change = f"+{delta}" if delta > 0 else str(delta) if delta else "±0"
        rows.append(f"<tr><td>{layers}</td><td>{b} → {a}</td><td class='hs-cache-delta'>{change}</td></tr>")
    return ('<table class="hs-cache"><caption>KV cache length per layer: before → after</caption>'
            "<thead><tr><th>layers</th><th>before → after</th><th>change</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def round_html(rounds: list[dict], i: int, levels: tuple | None = None) -> str:
    """Round i of a replay as numbered steps, its plan and the KV cache lengths before and after;
    `levels`: the run's list below the full model as written (RunRecord.spec: its exits by role)."""
    if not rounds:
        return ('<div id="hs-step" class="hs-steps" data-round=""><span class="hs-empty">'
                "Generate first: each round of the finished run can then be replayed step by step.</span></div>")
    i = min(max(i, 0), len(rounds) - 1)
    rnd = rounds[i]
    roles = levels_by_role(tuple(levels or ()))
    head = [round_label(rounds, i)]
    plan = rnd.get("plan")
    if plan:
        head.append("plan: " + plan["words"] + (f" ({plan['reason']})" if plan.get("reason") else ""))
    steps = [_step_html(k, step, roles) for k, step in enumerate(rnd["steps"], 1)]
    summary = [f"{_plural(rnd['committed_total'], 'token')} committed so far",
               f"{rnd['tentative']} pending", f"layers ran {_ms(rnd['seconds'])}"]
    if rnd.get("wall_seconds") is not None:
        summary.append(f"round took {_ms(rnd['wall_seconds'])}")
    if not rnd.get("complete", True):
        summary.append("generation stopped inside this round")
    return (f'<div id="hs-step" class="hs-steps" data-round="{int(rnd["round"])}">'
            f'<div class="hs-step-head">{html.escape(_SEP.join(head))}</div>'
            f'<ol class="hs-step-list">{"".join(steps)}</ol>'
            f'<div class="hs-step-summary">{html.escape(_SEP.join(summary))}</div>'
            f'{step_key_html(roles, levels is None or "lookup" in tuple(levels))}'
            f'{cache_table_html(rnd["cache_before"], rnd["cache_after"])}</div>')


def step_key_html(roles: dict, lookup: bool = True) -> str:
    """The key of the steps' left edges (the same hue per level as the text and the depth strip): the
    run's own levels (`roles`: its exits by role; `lookup`: it has a lookup level)."""
    exact = {role for role, level in roles.items() if "@" not in str(level)}
    cheap = [level for level in roles.values() if "@" in str(level)]
    items = [("lookup", "lookup")] if lookup else []
    items += [(role, words) for role, words in (("draft", "draft exit"), ("verify", "intermediate exit"))
              if role in exact or not roles]
    items += [("precision", level_words(cheap[0]).removeprefix("the "))] if cheap else []
    items += [("target", "full model")]
    return ('<div class="hs-step-key">Left edge, by level (the same colours as the text and the depth strip): '
            + "".join(f'<span class="hs-step hs-step-{cls}">{html.escape(words)}</span>' for cls, words in items)
            + "</div>")
