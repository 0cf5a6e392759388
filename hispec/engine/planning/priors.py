"""The adaptive policy's acceptance priors for a level list, read from the model's trained exits'
manifest (measured acceptance in generations, else the heads' own agreement)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hispec.engine.levels import LOOKUP

if TYPE_CHECKING:
    from hispec.model.early_exit import EarlyExitModel


def acceptance_priors(ee: EarlyExitModel, levels) -> dict[tuple[str, str], float]:
    """Acceptance priors for the auto policy, all measured and shipped in the trained exits' manifest.
    First choice, `policy_priors` (scripts/measure_priors.py: acceptance in generations on the tuning
    split): "D-target" for exit D judged by the full model, "D-V" for exit D judged by exit V, and
    "lookup:N" for a lookup copy after an n-token match. Where a pair has none of those (heads a user
    trained), the heads' own evaluation: an exit's agreement with the final layer (`agreement`), two
    exits' agreement with each other (`pairs`, not the lower exit's with the final layer). A level in a
    cheaper format has only its measured figures, keyed by its spec ("full@q4-target", "4@q4-full@q4").
    A pair with nothing measured gets policy.UNKNOWN_PRIOR."""
    info = getattr(ee, "exit_info", None) or {}
    evaluation, measured = info.get("evaluation") or {}, info.get("policy_priors") or {}
    agreement, pairs = evaluation.get("agreement") or {}, evaluation.get("pairs") or {}
    exits = measured.get("exits") or {}
    priors = {}
    for i, level in enumerate(levels):
        if level.kind == LOOKUP or level.name == "target":
            continue
        for above in levels[i + 1 :]:
            judge = "target" if above.name == "target" else str(above.spec)
            rate = exits.get(f"{level.spec}-{judge}")  # e.g. "2-4", "2-target", "full@q4-target", "4@q4-full@q4"
            if level.precision is not None or above.precision is not None:
                pass  # a level in a cheaper format: only what was measured for it (policy_priors)
            elif rate is None and above.name != "target":
                rate = (pairs.get(f"{level.layer}-{above.layer}") or {}).get("trained")
            elif rate is None:
                rate = (agreement.get(str(level.layer)) or {}).get("trained")
            if rate is not None:
                priors[(level.name, above.name)] = float(rate)
    if levels and levels[0].kind == LOOKUP:
        for holder, rate in (measured.get("lookup") or {}).items():
            priors[(holder, "target")] = float(rate)
    return priors
