"""Did the adaptive policy's estimates hold? Per kind of plan, what it expected when it chose (its estimate
over a plain step's) against what that kind realized (its tokens/s over the plain rounds' tokens/s), over
hispec/auto generations of the tuning split's prompts (128 new tokens). The basis of policy.MIN_GAIN.

    python scripts/plan_realized.py q4 3      (weights fp32 or q4, prompts per held-out set)
"""
import statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from collections import defaultdict
from hispec.model.loading import load_model
from hispec.engine.config import preset
from hispec.runs.runner import decoder_for
from hispec.engine.events import PolicyEvent
from hispec.data.prompts import load_sets
lm = load_model("default", device="cpu", weights=sys.argv[1] if len(sys.argv) > 1 else "q4")
import random
from hispec.data.prompts import apply_split
from hispec.training.heads.prompts import heldout_prompts
held = apply_split(heldout_prompts(lm), "tune")
sets = {k: random.Random(0).sample(v, min(int(sys.argv[2]), len(v))) for k, v in held.items()}
expect = defaultdict(list); real = defaultdict(lambda: [0, 0.0, 0]); tot = [0, 0.0]
for name, prompts in sets.items():
    for p in prompts:
        ids = lm.encode(p.text, chat=p.chat)
        cfg = preset("hispec", max_new_tokens=128).resolve_for(lm.ee)
        dec = decoder_for(lm, ids, cfg)
        orig = dec.policy.observe_round
        def rec(plan, committed, seconds, orig=orig):
            k = plan.round.kind.key; r = real[k]; r[0] += committed; r[1] += seconds; r[2] += 1
            return orig(plan, committed, seconds)
        dec.policy.observe_round = rec
        t = time.perf_counter()
        for ev in dec.events():
            if isinstance(ev, PolicyEvent) and ev.estimates and "plain" in ev.estimates and ev.choice in ev.estimates:
                expect[ev.plan.kind.key].append(ev.estimates[ev.choice] / ev.estimates["plain"])
plain = real["plain"][0] / real["plain"][1]
print(f"plain rounds: {real['plain'][2]}, {plain:.1f} tok/s")
for k, (n, s, r) in sorted(real.items(), key=lambda x: -x[1][2]):
    e = expect.get(k, [])
    print(f"{k:28s} rounds {r:4d}  tokens {n:5d}  realized {n / s / plain:.2f}x plain  expected {statistics.median(e) if e else float('nan'):.2f}x")
