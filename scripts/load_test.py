"""Load and abuse test of the app, loopback only, bounded in count and time.

Launches the app on a tiny random model (or targets --url), then runs N concurrent gradio_client
sessions mixing normal requests, Stops at random moments and bad inputs. Reports completed,
rejected-with-message and failed requests, latency percentiles, and checks that every completed
greedy output equals the engine's autoregressive output for its prompt (no crossed or corrupted
caches).

    python scripts/load_test.py --sessions 20 --requests 3 --json load.json
"""

from __future__ import annotations

import argparse
import html
import json
import random
import re
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PROMPTS = ["Hi", "Tell me a story", "abc", "2+2=?", "Why is the sky blue?", "Name a color", "ok", "Hello there"]
SETTINGS = ("HiSpec", 2, 5, 2, 3)
GREEDY = (0.0, 0, 1.0, -1)
REJECTED = ("hs-verify-rejected", "hs-target-rejected", "hs-discarded")


def committed_text(tokens_html: str) -> str:
    spans = re.findall(r'<span class="hs-tok (hs-[\w-]+)"[^>]*>(.*?)</span>', tokens_html or "", re.S)
    return "".join(html.unescape(t) for cls, t in spans if cls not in REJECTED)


def plain(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment or ""))


def serve(max_new: int):
    """The app on the tiny test model; returns (url, close, expected texts by prompt)."""
    import torch
    from helpers import EOS, char_tokenizer, tiny_model

    import app
    from hispec.engine.decoding import DecodeConfig
    from hispec.model.early_exit import EarlyExitModel
    from hispec.serving.limits import Limits
    from hispec.model.loading import LoadedModel
    from hispec.evaluation.runner import run
    from hispec.serving.registry import ModelRegistry
    from hispec.text import Detokenizer

    torch.set_num_threads(1)
    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    lm = LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "load-test")
    registry = ModelRegistry(device="cpu", limits=Limits(rate_per_minute=0, queue_size=64, max_seconds=60))
    registry.add("tiny", lm)
    expected = {p: lm.tokenizer.decode(run(lm.ee, lm.encode(p), DecodeConfig("autoregressive", max_new_tokens=max_new),
                                           eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer)).token_ids)
                for p in PROMPTS}
    demo = app.App(registry, "tiny", ["tiny"]).build()
    demo.queue(max_size=64).launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True,
                                   **app.launch_kwargs())
    return demo.local_url, demo.close, expected


def session(url, n_requests, max_new, rng, expected, deadline, out, lock):
    from gradio_client import Client

    client = Client(url, verbose=False)
    for _ in range(n_requests):
        if time.monotonic() > deadline:
            break
        kind = rng.choices(["normal", "stop", "bad"], weights=[6, 2, 2])[0]
        prompt = rng.choice(PROMPTS)
        t0 = time.monotonic()
        record = {"kind": kind, "prompt": prompt}
        try:
            if kind == "bad":
                bad = rng.choice([("", SETTINGS), (prompt, ("HiSpec", 5, 3, 2, 3)), (prompt, ("HiSpec", 2, 5, 0, 3))])
                result = client.submit(bad[0], "tiny", *bad[1], max_new, True, *GREEDY,
                                       api_name="/generate").result(timeout=60)
                status = plain(result[0])
                record["outcome"] = "rejected_with_message" if "hs-msg-error" in result[0] and status else "failed"
                record["message"] = status[:120]
            else:
                job = client.submit(prompt, "tiny", *SETTINGS, max_new, True, *GREEDY, api_name="/generate")
                if kind == "stop":
                    time.sleep(rng.uniform(0, 0.5))
                    client.predict(api_name="/stop")
                result = job.result(timeout=60)
                text, status = committed_text(result[1]), plain(result[0])
                want = expected.get(prompt)
                ok = (text == want) if kind == "normal" or "Done" in status else want is None or want.startswith(text)
                if kind == "stop" and "stopped" not in status.lower() and "Done" not in status:
                    ok = False
                record["outcome"] = "completed" if ok and status else "failed"
                if not ok:
                    record["message"] = f"output differs: {text[:60]!r} vs {want and want[:60]!r} ({status})"
        except Exception as exc:  # the app's readable refusal (AppError), or a crash / timeout
            message = str(exc)
            readable = type(exc).__name__ == "AppError" and message.strip()
            record["outcome"] = "rejected_with_message" if readable or "queue" in message.lower() else "failed"
            record["message"] = f"{type(exc).__name__}: {message[:160]}"
        record["latency_s"] = time.monotonic() - t0
        with lock:
            out.append(record)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--requests", type=int, default=3, help="requests per session")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--max-seconds", type=float, default=240, help="stop sending after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    url, close, expected = serve(args.max_new_tokens)
    records, lock = [], threading.Lock()
    deadline = time.monotonic() + args.max_seconds
    t0 = time.monotonic()
    threads = [threading.Thread(target=session, args=(url, args.requests, args.max_new_tokens,
                                                      random.Random(args.seed * 1000 + i), expected, deadline,
                                                      records, lock), daemon=True) for i in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic() + 90))
    close()
    latencies = sorted(r["latency_s"] for r in records if r["outcome"] == "completed")

    def pct(q):
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3) if latencies else None

    report = {"sessions": args.sessions, "requests_per_session": args.requests, "seconds": round(time.monotonic() - t0, 1),
              "completed": sum(r["outcome"] == "completed" for r in records),
              "rejected_with_message": sum(r["outcome"] == "rejected_with_message" for r in records),
              "failed": sum(r["outcome"] == "failed" for r in records),
              "unfinished_sessions": sum(t.is_alive() for t in threads),
              "latency_s": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                            "mean": round(statistics.mean(latencies), 3) if latencies else None},
              "by_kind": {k: sum(r["kind"] == k for r in records) for k in ("normal", "stop", "bad")},
              "failures": [r for r in records if r["outcome"] == "failed"][:10]}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({**report, "records": records}, indent=1))
    return 0 if report["failed"] == 0 and report["unfinished_sessions"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
