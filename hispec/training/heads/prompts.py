"""The prompts train-exits uses, in its order, and the held-out ones among them: the clean prompts
to benchmark trained exit heads with (prompt set 'heldout' in bench)."""

from __future__ import annotations

from hispec.errors import ConfigError
from hispec.training.heads.data import split_prompts


def usable_prompts(lm, spec: str, max_prompt_tokens: int, seed: int) -> list[tuple[str, object, list[int]]]:
    """(set name, prompt, token ids) of the prompts train-exits uses, in its order."""
    from hispec.data.prompts import load_sets

    out = []
    for name, prompts in load_sets(spec, seed=seed).items():
        for p in prompts:
            if p.text.strip():
                tokens = lm.encode(p.text, chat=p.chat)
                if len(tokens) <= max_prompt_tokens:
                    out.append((name, p, tokens))
    return out


def heldout_prompts(lm) -> dict[str, list]:
    """The prompts the attached exit heads were evaluated on and never trained on, by set: the
    clean prompts to benchmark them with (prompt set 'heldout' in bench)."""
    info = getattr(lm.ee, "exit_info", None) or {}
    training = info.get("training") or {}
    options = training.get("options") or {}
    spec = training.get("prompt_spec")
    if not spec:
        raise ConfigError("prompt set 'heldout' needs trained exit heads whose manifest records their prompts "
                          "(made by train-exits); this model has none")
    usable = usable_prompts(lm, spec, int(options.get("max_prompt_tokens", 256)), int(training.get("seed", 0)))
    _, held = split_prompts(len(usable), float(training.get("holdout", 0.1)), int(training.get("seed", 0)))
    sets: dict[str, list] = {}
    for i in sorted(held):
        name, prompt, _ = usable[i]
        sets.setdefault(f"heldout-{name}", []).append(prompt)
    return sets


def prompt_ids(lm, spec: str, max_prompt_tokens: int, seed: int) -> list[list[int]]:
    ids = [tokens for _, _, tokens in usable_prompts(lm, spec, max_prompt_tokens, seed)]
    if len(ids) < 2:
        raise ConfigError(f"--prompts '{spec}' gives {len(ids)} usable prompt(s) of at most {max_prompt_tokens} "
                          f"tokens; give more prompts (train-exits holds some out for evaluation)")
    return ids
