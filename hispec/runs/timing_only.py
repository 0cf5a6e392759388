"""TIMING ONLY: acceptance decisions that do not come from the model.

On models whose exits cannot agree with the full model (random weights in the shapes of real
checkpoints, as on a GPU machine where no checkpoint can be downloaded), these judges decide how
many pending tokens a stage accepts, so that timings show what the hierarchy saves at a given
acceptance on real step costs: every pass, head and synchronisation still runs. The text such a
run writes is NOT the model's output: never show it to users. A generation run with a judge says
so in its settings (``timing_only``).

- ``SyntheticAcceptance``: each pending token is accepted with a fixed probability per stage.
- ``RecordedAcceptance``: the acceptance pattern of real generations (runs of accepted tokens per
  stage, with their burstiness), recorded from ``Decoder.decisions`` and replayed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

STAGES = ("verify", "target")


class SyntheticAcceptance:
    """Accept each pending token with a fixed probability per stage, whatever the model predicted."""

    def __init__(self, verify: float, target: float, seed: int = 0):
        self.rates = {"verify": verify, "target": target}
        self._rng = random.Random(seed)

    def __call__(self, stage: str, n: int) -> int:
        accepted = 0
        while accepted < n and self._rng.random() < self.rates[stage]:
            accepted += 1
        return accepted

    def describe(self) -> str:
        return f"synthetic acceptance {self.rates} (timing only, output is not the model's)"


class RecordedAcceptance:
    """Replay recorded runs of accepted tokens, stage by stage.

    A run is how many pending tokens a stage accepted in a row before it rejected one, counted
    across verdicts (a verdict that accepts its whole block continues the run). Replaying runs
    rather than verdicts keeps the pattern when the blocks are cut differently (another
    number of drafts per round, the end of a generation), and keeps its bursts, which fixed rates do not.
    The runs are replayed in order and start again from the first when they run out.
    """

    def __init__(self, runs: dict[str, list[int]], source: str = "recorded"):
        self.runs = {stage: [int(r) for r in runs.get(stage, [])] for stage in STAGES}
        for stage, stage_runs in self.runs.items():
            if any(r < 0 for r in stage_runs):
                raise ValueError(f"recorded runs must be 0 or more; stage '{stage}' has a negative one")
        self.source = source
        self._next = {stage: 0 for stage in STAGES}
        self._left = {stage: None for stage in STAGES}  # accepts left in the current run

    @staticmethod
    def runs_from(decisions: list[tuple[str, int, int]]) -> dict[str, list[int]]:
        """Runs per stage from one generation's verdicts (stage, pending tokens, accepted).
        A run still open when the generation ends counts as ended there."""
        runs: dict[str, list[int]] = {stage: [] for stage in STAGES}
        open_run = {stage: 0 for stage in STAGES}
        for stage, n, accepted in decisions:
            open_run[stage] += accepted
            if accepted < n:
                runs[stage].append(open_run[stage])
                open_run[stage] = 0
        for stage in STAGES:
            if open_run[stage]:
                runs[stage].append(open_run[stage])
        return runs

    def __call__(self, stage: str, n: int) -> int:
        if not self.runs[stage]:
            raise ValueError(f"no recorded runs for stage '{stage}' ({self.source})")
        if self._left[stage] is None:
            self._left[stage] = self.runs[stage][self._next[stage]]
            self._next[stage] = (self._next[stage] + 1) % len(self.runs[stage])
        left = self._left[stage]
        if left >= n:  # the whole block is accepted; the run goes on into the next verdict
            self._left[stage] = left - n
            return n
        self._left[stage] = None  # the run ends here, on a rejection
        return left

    def rates(self) -> dict[str, float | None]:
        """Per-token acceptance implied by the runs (accepts / tokens judged)."""
        out = {}
        for stage, runs in self.runs.items():
            judged = sum(runs) + len(runs)
            out[stage] = sum(runs) / judged if judged else None
        return out

    def describe(self) -> str:
        shown = {k: round(v, 3) for k, v in self.rates().items() if v is not None}
        return f"recorded acceptance from {self.source}, per-token rates {shown} (timing only, output is not the model's)"

    def to_dict(self, **info) -> dict:
        return {"source": self.source, "rates": self.rates(), **info, "runs": self.runs}

    @classmethod
    def from_dict(cls, data: dict) -> RecordedAcceptance:
        return cls(data["runs"], data.get("source", "recorded"))

    @classmethod
    def load(cls, path: str | Path, pattern: str) -> RecordedAcceptance:
        """One named pattern of a file written by scripts/gpu/record_acceptance.py."""
        data = json.loads(Path(path).read_text())
        if pattern not in data.get("patterns", {}):
            raise ValueError(f"{path} has no acceptance pattern '{pattern}'; it has: "
                             f"{', '.join(data.get('patterns', {})) or 'none'}")
        return cls.from_dict(data["patterns"][pattern])
