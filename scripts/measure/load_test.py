"""Load and abuse test of the app over HTTP on loopback: a test that can fail.

Serves the app in this process (the tiny random test model, or the real default model with
--model default) and runs N concurrent gradio_client sessions, each a visitor of its own (its own
client address, forwarded by a proxy the server trusts), each sending R requests through the
public API with named inputs: short and long greedy generations, Stops at random moments from the
same session (a third of them sent the moment gradio_client's submit() returns, before its request
may have reached the server), late readers (a REST client that posts /generate and opens its update
stream LATE_S seconds later, as a live client on a busy host does), and malformed inputs. It checks
every answer:

  normal   (short, --max-new-tokens) and long (--long-tokens, a --long-share of the generations)
           must complete, and its token ids must equal the engine's own greedy output for its prompt
           (computed before the load starts); an answer equal to another prompt's is counted as
           `crossed`, any other difference, refusal or error as `failed`
  stop     must end stopped with a prefix of its prompt's greedy output (or before it started), or
           done with all of it only when it was done before the Stop was sent or ended within
           STOP_MARGIN_S of the Stop's reply: a run that goes on to its end long after its Stop was
           answered is a Stop that was lost, a failure. Every Stop's reply and timing is recorded.
  late     like normal: a live client that reads late must get its whole answer, never "the client left"
  bad      must be refused with a readable message (an AppError), never a crash or a hang

Any request of a live client that ends as "the client left" is counted (`left`) and fails the run,
and so does a Stop that was lost (`stops.ran_in_full`).

Memory: the process's resident memory (server and clients, one process) is sampled every RSS_STEP_S
through the load; the report's `memory` gives it at the start, its peak and at the end, with
MALLOC_ARENA_MAX as it was (a Space runs with 2: hispec/serving/memory.py). A peak more than
--max-rss-growth-mb above the start fails the run (it grew 1,856 -> 3,088 MB over about 500 requests
with glibc's default arenas, Python's object counts flat).

The limits are set so that no normal request may be refused (queue and time limit above the load,
no rate limit): a refusal of a normal request is a failure. Exit code 0 only when nothing failed,
nothing crossed and every session finished (so a failed request fails the run). The JSON report holds the counts, p50/p90/p99 latency,
the machine and every failure; a short request's latency is reported apart from a long one's (with
the model shared round by round, a short request should not wait for the long ones to finish). If a
session never finishes, the report says what serving still holds (its jobs, the model's turn) and the
threads' stacks go to stderr.

    python scripts/measure/load_test.py --sessions 50 --requests 3 --model default --json assets/load/load_cpu_default.json

A class (--class-size N): a teacher's class opening the app at once (issue 60). N sessions join within
--join-seconds, all behind one school network address (--one-address) or each on its own, and each sends
one greedy generation. The server runs with its default limits (rates, queue, joins): every request must
be admitted and its answer must equal the engine's own greedy output for its prompt; the report gives each
visitor's first-token latency (from its submit to its first update with a token).

    python scripts/measure/load_test.py --class-size 30 --one-address --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PROMPTS = ["Hi", "Tell me a story", "abc", "2+2=?", "Why is the sky blue?", "Name a color", "ok", "Hello there"]
BAD = [({"prompt": ""}, "prompt is empty"), ({"levels": "5,3"}, "exit layers must increase"),
       ({"top_k": -1}, "top-k must be from 0"), ({"max_new_tokens": 10**400}, "is over this app's limit"),
       ({"method": ["hispec"]}, "Unknown method"), ({"temperature": 1e-300}, "Temperature must be 0"),
       ({"model": "/etc"}, "is not offered on this server")]
# a run that ended within this long of its Stop's reply may have finished before the Stop reached it
# (its last update is sent up to the server's throttle after its last round); one that ran on longer was
# running when the Stop was answered, and should have stopped
STOP_MARGIN_S = 1.0
CONNECT_TIMEOUT_S = 120.0  # a session's HTTP calls (gradio_client's default of 5 s failed 23 of 50 connects, load 18)
KINDS = {"normal": 5, "stop": 3, "bad": 1, "late": 2}  # how often each kind of request is sent (weights)
LATE_S = (2.0, 8.0)  # a late reader opens its stream this many seconds after its request (beyond the old 5 s rule)
STOP_WHEN = ("at once", "0 ms", "later")  # a Stop: as submit() returns, 0 ms after the join was answered, or 0-1 s


def machine() -> str:
    flags = ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
        flags = " (AVX-512)" if "avx512f" in info else " (no AVX-512)"
    except OSError:
        name = platform.processor()
    return f"{name}{flags}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


SERVED: dict = {}  # the serving.session.Server of the last serve(): what a stuck run reports


def serve(model: str, max_new: int, sessions: int, default_limits: bool = False):
    """The app on loopback; returns (url, close, expected token ids by prompt: `max_new` of them).
    Every visitor's address is the X-Forwarded-For its session sends (loopback is a trusted proxy).
    `default_limits`: the server's own default rates, queue and joins (a class), else none that could refuse."""
    import torch

    import app
    from hispec.engine.config import preset
    from hispec.runs.runner import run_loaded
    from hispec.model.loading import LoadedModel
    from hispec.serving.limits import Limits
    from hispec.serving.registry import ModelRegistry

    if model == "tiny":
        from helpers import EOS, char_tokenizer, tiny_model
        from hispec.model.early_exit import EarlyExitModel

        torch.set_num_threads(1)
        net = tiny_model("llama", layers=8)
        net.generation_config.eos_token_id = EOS
        lm = LoadedModel("tiny", net, char_tokenizer(), EarlyExitModel(net), "cpu", "float32", 0.0, "load-test")
    else:
        from hispec.model.loading import load_model

        lm = load_model(model, device="cpu")
    registry = ModelRegistry(device="cpu")
    registry.add(model, lm)
    limits = Limits(rate_per_minute=0, address_rate_per_minute=0, global_rate_per_minute=0, join_rate_per_minute=0,
                    queue_size=4 * sessions, max_seconds=3600, allowed_models=(model,), trusted_proxies=("127.0.0.1",))
    if default_limits:
        limits = Limits(allowed_models=(model,), trusted_proxies=("127.0.0.1",))
    config = preset("autoregressive", max_new_tokens=max_new, policy="fixed")
    expected = {p: run_loaded(lm, lm.encode(p), config).token_ids for p in PROMPTS}
    server = SERVED["server"] = app.serve(registry, model, limits)
    demo = app.build(server, [model])
    demo.queue(max_size=8 * sessions, default_concurrency_limit=None).launch(
        prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **app.launch_kwargs(server))
    return demo.local_url, lambda: app.close(demo), expected


def judge(kind: str, prompt: str, ids: list[int] | None, finish: str | None, expected: dict,
          stop: dict | None = None) -> tuple[str, str]:
    """(outcome, message) of one answer: completed | crossed | failed; `stop`: a stop request's
    record of its Stop (done_before_stop, result_after_reply_s, stop_reply)."""
    want = expected[prompt]
    if finish == "left":
        return "failed", "ended as \"the client left\" while its client was there, reading"
    if kind in ("normal", "long", "late"):
        if ids == want:
            return "completed", ""
        other = next((p for p, w in expected.items() if p != prompt and w == ids), None)
        if other is not None:
            return "crossed", f"got the answer of {other!r}"
        return "failed", f"output differs from the engine's greedy output ({finish})"
    if finish == "stopped" and ids == want[: len(ids)]:
        return "completed", ""
    if ids == want:
        if stop and not stop["done_before_stop"] and stop["result_after_reply_s"] > STOP_MARGIN_S:
            return "failed", (f"a Stop ran in full: answered {stop['stop_reply']!r}, then the run went on for "
                              f"{stop['result_after_reply_s']:.2f} s and wrote all {len(ids)} tokens ({finish})")
        return "completed", ""  # finished before the Stop arrived
    if finish == "stopped":
        return "failed", "a stopped output is not a prefix of the greedy output"
    return "failed", f"cut without saying so: {len(ids or [])} of {len(want)} tokens, finish reason {finish!r}"


def one_request(client, kind: str, prompt: str, max_new: int, rng: random.Random, expected: dict) -> dict:
    """One request of `kind` and its record; `expected`: each prompt's greedy output of `max_new` tokens."""
    from gradio_client.exceptions import AppError

    record = {"kind": kind, "prompt": prompt}
    named = {"prompt": prompt, "max_new_tokens": max_new, "temperature": 0.0}
    t0 = time.monotonic()
    try:
        if kind == "bad":
            change, words = rng.choice(BAD)
            record["bad"] = words
            try:
                client.predict(**{**named, **change}, api_name="/generate")
                record.update(outcome="failed", message=f"accepted a malformed input ({words})")
            except AppError as exc:
                if "a Stop of this session that found nothing running arrived" in str(exc):  # serving.jobs.AHEAD_S
                    record.update(outcome="stopped_ahead", message=str(exc)[:200])
                    record["latency_s"] = round(time.monotonic() - t0, 3)
                    return record
                ok = words in str(exc)
                record.update(outcome="refused_as_expected" if ok else "failed", message=str(exc)[:160])
        else:
            job = client.submit(**named, api_name="/generate")
            stop, replied_at = None, None
            if kind == "stop":
                when = rng.choice(STOP_WHEN)
                stop = send_stop(client, job, {"at once": None, "0 ms": 0.0}.get(when, rng.uniform(0.0, 1.0)))
                replied_at = stop.pop("replied_at")
                record.update(stop)
            try:
                out = job.result(timeout=3600)
            except AppError as exc:  # a Stop that reached the request before it started
                if kind == "stop" and "Stopped before the generation started" in str(exc):
                    record.update(outcome="completed", message="stopped before it started", finish="stopped")
                    record["latency_s"] = round(time.monotonic() - t0, 3)
                    return record
                if "a Stop of this session that found nothing running arrived" in str(exc):  # serving.jobs.AHEAD_S
                    record.update(outcome="stopped_ahead", finish="stopped", message=str(exc)[:200])
                    record["latency_s"] = round(time.monotonic() - t0, 3)
                    return record
                if "The client left" in str(exc):
                    record.update(outcome="failed", finish="left", message=f"ended as the client left: {exc}")
                    record["latency_s"] = round(time.monotonic() - t0, 3)
                    return record
                raise
            if stop:
                stop["result_after_reply_s"] = record["result_after_reply_s"] = round(time.monotonic() - replied_at, 3)
            outcome, message = judge(kind, prompt, out.get("token_ids"), out["stats"].get("finish_reason"), expected,
                                     stop)
            record.update(outcome=outcome, message=message, finish=out["stats"].get("finish_reason"),
                          new_tokens=len(out.get("token_ids") or []), levels=levels_of(out))
    except Exception as exc:  # a refusal of a normal request, a crash or a timeout: all failures
        record.update(outcome="failed", message=f"{type(exc).__name__}: {str(exc)[:200]}")
    record["latency_s"] = round(time.monotonic() - t0, 3)
    return record


def levels_of(out: dict) -> str | None:
    """The level list a generation ran, e.g. "lookup -> full@q4 -> full" (the exact model, the last word, is
    not in the settings' list)."""
    levels = [str(level) for level in (out.get("settings") or {}).get("levels") or ()]
    return " -> ".join(levels + ["full"] * (levels[-1:] != ["full"])) if levels else None


def send_stop(client, job, delay_s: float | None) -> dict:
    """Stop `job` `delay_s` after it was sent (its queue join answered: the request is at the server,
    so the Stop comes after it), or at once (None: as submit() returned, before the request may have
    been sent); what the Stop found and said."""
    t0 = time.monotonic()
    while (delay_s is not None and getattr(job.communicator, "event_id", None) is None and not job.done()
           and time.monotonic() - t0 < 60):
        time.sleep(0.001)
    time.sleep(delay_s or 0.0)
    done = job.done()
    reply = client.predict(api_name="/stop")
    return {"stop_after_s": None if delay_s is None else round(delay_s, 3), "done_before_stop": done, "replied_at": time.monotonic(),
            "stop_reply": re.sub(r"<[^>]+>", "", str(reply)).strip()[:120]}


def late_request(url: str, visitor: str, prompt: str, max_new: int, rng: random.Random, expected: dict) -> dict:
    """A REST client that posts /generate, opens its update stream LATE_S later and reads it to the end."""
    import httpx

    from hispec.serving.api import api_signature

    record = {"kind": "late", "prompt": prompt, "late_s": round(rng.uniform(*LATE_S), 2)}
    fields = {name: p.default for name, p in api_signature().parameters.items()}
    fields.update(prompt=prompt, max_new_tokens=max_new, temperature=0.0)
    headers = {"X-Forwarded-For": visitor}
    t0 = time.monotonic()
    try:
        posted = httpx.post(f"{url}gradio_api/call/generate", json={"data": list(fields.values())}, headers=headers,
                            timeout=60)
        posted.raise_for_status()
        time.sleep(record["late_s"])
        with httpx.stream("GET", f"{url}gradio_api/call/generate/{posted.json()['event_id']}", headers=headers,
                          timeout=3600) as stream:
            event, answer = None, None
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event in ("complete", "error"):
                    answer = (event, json.loads(line.split(":", 1)[1]))
                    break
        if answer is None or answer[0] != "complete":
            message = str(answer[1] if answer else "the stream ended without an answer")
            left = "The client left" in message
            record.update(outcome="failed", finish="left" if left else None, message=message[:200])
        else:
            out = answer[1][0]
            finish = out["stats"].get("finish_reason")
            outcome, message = judge("late", prompt, out.get("token_ids"), finish, expected)
            record.update(outcome=outcome, message=message, finish=finish, new_tokens=len(out.get("token_ids") or []),
                          levels=levels_of(out))
    except Exception as exc:
        record.update(outcome="failed", message=f"{type(exc).__name__}: {str(exc)[:200]}")
    record["latency_s"] = round(time.monotonic() - t0, 3)
    return record


def address(i: int) -> str:
    """Session i's client address (its visitor)."""
    return f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"


def session(url, i, n_requests, lengths, long_share, rng, expected, deadline, out, lock):
    """Session i's requests; `lengths`: (short, long) new tokens; `expected`: greedy output by prompt."""
    from gradio_client import Client

    try:  # every session connects at once: on a busy host the app's config and API page take a while to serve
        client = Client(url, verbose=False, headers={"X-Forwarded-For": address(i)},
                        httpx_kwargs={"timeout": CONNECT_TIMEOUT_S})
    except Exception as exc:
        with lock:
            out.append({"kind": "connect", "outcome": "failed", "message": f"{type(exc).__name__}: {exc}"})
        return
    for _ in range(n_requests):
        if time.monotonic() > deadline:
            break
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        if kind == "normal" and rng.random() < long_share:
            kind = "long"
        max_new = lengths[kind == "long"]
        want = {p: ids[:max_new] for p, ids in expected.items()}  # greedy output is a prefix of a longer one
        if kind == "late":
            record = late_request(url, address(i), rng.choice(PROMPTS), max_new, rng, want)
        else:
            record = one_request(client, kind, rng.choice(PROMPTS), max_new, rng, want)
        with lock:
            out.append(record)


SCHOOL = "192.0.2.10"  # --one-address: every student's address (a documentation range, RFC 5737)
FIRST_TOKEN = re.compile(r"generating: [1-9]")  # /generate's progress once it has a token (serving.answer)


TEACHER = "10.254.0.1"  # the warm-up's address (class_run): none of the students'


def student(url, i, address_of, start_at, max_new, expected, out, lock):
    """Student i of a class: connects at `start_at`, sends one greedy generation, and records its outcome,
    its first-token latency (from its submit) and its whole latency."""
    from gradio_client import Client

    time.sleep(max(0.0, start_at - time.monotonic()))
    prompt = PROMPTS[i % len(PROMPTS)]
    record = {"kind": "class", "prompt": prompt, "address": address_of(i)}
    try:
        client = Client(url, verbose=False, headers={"X-Forwarded-For": address_of(i)},
                        httpx_kwargs={"timeout": CONNECT_TIMEOUT_S})
        t0 = time.monotonic()
        job = client.submit(prompt=prompt, max_new_tokens=max_new, temperature=0.0, api_name="/generate")
        first = None
        for update in job:
            if first is None and isinstance(update, dict) and (FIRST_TOKEN.match(str(update.get("status", "")))
                                                               or update.get("token_ids")):
                first = time.monotonic() - t0
        answer = job.result(timeout=3600)
        outcome, message = judge("normal", prompt, answer.get("token_ids"), answer["stats"].get("finish_reason"),
                                 expected)
        record.update(outcome=outcome, message=message, first_token_s=None if first is None else round(first, 3),
                      latency_s=round(time.monotonic() - t0, 3))
    except Exception as exc:  # a refusal (a rate limit, a full queue, the edge's 429) is a failure too
        record.update(outcome="failed", message=f"{type(exc).__name__}: {str(exc)[:200]}")
    with lock:
        out.append(record)


def class_run(args) -> int:
    """--class-size: N students join within --join-seconds, one request each, under the default limits."""
    url, close, expected = serve(args.model, args.max_new_tokens, args.class_size, default_limits=True)
    address_of = (lambda i: SCHOOL) if args.one_address else address
    warm = []  # the teacher's own run first, as a Space has served before a class arrives: the server's first
    #            generation calibrates the model's costs (about a second), which no student should be timed on
    student(url, 0, lambda i: TEACHER, time.monotonic(), args.max_new_tokens, expected, warm, threading.Lock())
    records, lock, t0 = [], threading.Lock(), time.monotonic()
    threads = [threading.Thread(target=student, args=(url, i, address_of, t0 + args.join_seconds * i / args.class_size,
                                                      args.max_new_tokens, expected, records, lock), daemon=True)
               for i in range(args.class_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.max_seconds + args.grace_seconds)
    seconds = time.monotonic() - t0
    close()
    firsts = [r["first_token_s"] for r in records if r.get("first_token_s") is not None]
    from hispec.evaluation.record import code_version
    from hispec.serving.limits import Limits

    report = {"command": "python scripts/measure/load_test.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "machine": machine(), "host_note": args.host_note, "model": args.model, "mode": "class",
              "class_size": args.class_size, "join_seconds": args.join_seconds, "max_new_tokens": args.max_new_tokens,
              "visitors": "one client address for the class" if args.one_address else "one client address each",
              "warm_up": {"outcome": warm[0]["outcome"], "latency_s": warm[0].get("latency_s"),
                          "what": "one request from another address before the class joined (not counted)"},
              "limits": {k: getattr(Limits(), k) for k in ("rate_per_minute", "address_rate_per_minute",
                                                           "global_rate_per_minute", "queue_size",
                                                           "join_rate_per_minute")},
              "seconds": round(seconds, 1), "requests": len(records),
              **{k: sum(r["outcome"] == k for r in records) for k in ("completed", "crossed", "failed")},
              "refused": sum("rate limit" in r.get("message", "").lower() or "busy" in r.get("message", "")
                             or "429" in r.get("message", "") for r in records),
              "first_token_s": {"median": statistics.median(firsts) if firsts else None,
                                "slowest": max(firsts, default=None), "each": sorted(firsts)},
              "failures": [r for r in records if r["outcome"] != "completed"][:20]}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**report, "records": records}, indent=1) + "\n")
    return 0 if report["completed"] == args.class_size == len(records) else 1


RSS_STEP_S = 0.5  # how often the resident memory is sampled during the load


def rss_mb() -> float | None:
    """This process's resident memory now, in MB (/proc/self/status); None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class RssWatch:
    """The resident memory through the load: at its start, its peak (sampled every RSS_STEP_S) and at its end."""

    def __init__(self, max_growth_mb: float):
        self.max_growth_mb, self.start = max_growth_mb, rss_mb()
        self.peak, self._done = self.start, threading.Event()
        self._thread = threading.Thread(target=self._watch, name="load-test-rss", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(RSS_STEP_S):
            self._sample()

    def _sample(self) -> float | None:
        now = rss_mb()
        if now is not None:
            self.peak = now if self.peak is None else max(self.peak, now)
        return now

    def stop(self) -> dict:
        """The figures and whether the growth is within the limit (True where /proc cannot tell)."""
        self._done.set()
        self._thread.join(5)
        end = self._sample()
        growth = None if self.start is None or self.peak is None else self.peak - self.start
        mb = lambda v: None if v is None else round(v, 1)  # noqa: E731
        return {"rss_mb_start": mb(self.start), "rss_mb_peak": mb(self.peak), "rss_mb_end": mb(end),
                "rss_mb_growth": mb(growth), "max_rss_growth_mb": self.max_growth_mb,
                "within_limit": growth is None or growth <= self.max_growth_mb,
                "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX") or "unset (glibc's default: 8 per core)"}


def latency(records: list[dict], kind: str) -> dict:
    """p50/p90/p99/mean seconds of the completed requests of `kind`."""
    latencies = sorted(r["latency_s"] for r in records if r["kind"] == kind and r["outcome"] == "completed")

    def pct(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None

    return {"n": len(latencies), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
            "mean": round(statistics.mean(latencies), 3) if latencies else None}


def stuck() -> dict:
    """What serving still holds: its jobs and each model's turn (for a run whose sessions did not end)."""
    server = SERVED.get("server")
    if server is None:
        return {}
    jobs = [{"session": j.session, "kind": j.kind, "address": j.address, "reason": j.reason} for j in server.jobs.of()]
    turns = {name: {"busy": server.registry.turns(name).busy, "waiting": server.registry.turns(name).waiting}
             for name in server.registry.loaded()}
    return {"jobs": jobs[:50], "open_jobs": len(jobs), "turns": turns}


def print_stacks() -> None:
    """Every thread's stack, to stderr."""
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        print(f"--- thread {names.get(ident, ident)}", file=sys.stderr)
        traceback.print_stack(frame, file=sys.stderr)


def default_run(records: list[dict]) -> str | None:
    """The level list the generations ran (the most common one), e.g. "lookup -> full@q4 -> full"."""
    runs = [r["levels"] for r in records if r.get("levels")]
    return max(set(runs), key=runs.count) if runs else None


def seats_held() -> int | None:
    """How many generations could hold the model at once (serving.turns' seats; 1: one at a time)."""
    server = SERVED.get("server")
    if server is None:
        return None
    return max((server.registry.turns(name).seats for name in server.registry.loaded()), default=None)


def report_of(records: list[dict], args, seconds: float, unfinished: int, memory: dict | None = None) -> dict:
    # stopped_ahead: sent right after a Stop of its session that found nothing, and stopped by it (serving.jobs.AHEAD_S)
    count = {k: sum(r["outcome"] == k for r in records) for k in ("completed", "refused_as_expected", "crossed",
                                                                  "failed", "stopped_ahead")}
    from hispec.evaluation.record import code_version

    return {"command": "python scripts/measure/load_test.py " + " ".join(sys.argv[1:]), "code": code_version(),
            "machine": machine(),
            "host_note": args.host_note, "model": args.model, "default_run": default_run(records),
            "sessions": args.sessions, "requests_per_session": args.requests,
            "max_new_tokens": args.max_new_tokens, "long_tokens": args.long_tokens, "long_share": args.long_share,
            "visitors": "one client address per session", "seats": seats_held(),
            "seconds": round(seconds, 1), "requests": len(records), **count,
            "unfinished_sessions": unfinished, **({"stuck": stuck()} if unfinished else {}),
            "by_kind": {k: sum(r["kind"] == k for r in records) for k in ("normal", "long", "stop", "bad", "late")},
            # live clients' requests ended as "the client left" (each a failure too)
            "left": sum(r.get("finish") == "left" for r in records),
            "late_s": list(LATE_S),
            "stops": stop_counts([r for r in records if r["kind"] == "stop"]),
            # normal: the short generations (--max-new-tokens); long: --long-tokens
            "latency_s_normal": latency(records, "normal"), "latency_s_long": latency(records, "long"),
            "memory": memory or {},
            "failures": [r for r in records if r["outcome"] in ("failed", "crossed")][:20]}


def stop_counts(stops: list[dict]) -> dict:
    """What the Stops did: stopped (before or while running), done before the Stop was sent or
    reached it, ran in full long after their reply (lost: failures)."""
    ran_in_full = [r for r in stops if "a Stop ran in full" in r.get("message", "")]
    return {"sent": len(stops), "at_once": sum(r.get("stop_after_s") is None for r in stops),
            "at_0_ms": sum(r.get("stop_after_s") in (None, 0.0) for r in stops),
            "stopped": sum(r.get("finish") == "stopped" for r in stops),
            "done_before_it": sum(r.get("outcome") == "completed" and r.get("finish") != "stopped" for r in stops),
            "ran_in_full": len(ran_in_full)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=20, help="concurrent client sessions")
    parser.add_argument("--requests", type=int, default=3, help="requests per session")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="new tokens of a short generation")
    parser.add_argument("--long-tokens", type=int, default=None,
                        help="new tokens of a long generation (default: 4x --max-new-tokens)")
    parser.add_argument("--long-share", type=float, default=0.25, help="share of the generations that are long")
    parser.add_argument("--model", default="tiny", help="'tiny' (a random test model) or 'default' (the real one)")
    parser.add_argument("--max-seconds", type=float, default=900, help="stop sending new requests after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grace-seconds", type=float, default=600,
                        help="how long after --max-seconds a session may take to finish before it counts as stuck")
    parser.add_argument("--json", default=None, help="write the report (with every record) here")
    parser.add_argument("--host-note", default="", help="what else ran on the host (timings are only read with it)")
    parser.add_argument("--max-rss-growth-mb", type=float, default=1024,
                        help="fail when the resident memory's peak is this far above its start of the load")
    parser.add_argument("--class-size", type=int, default=0,
                        help="a class instead: this many sessions, one request each, under the default limits")
    parser.add_argument("--one-address", action="store_true", help="with --class-size: the class behind one address")
    parser.add_argument("--join-seconds", type=float, default=3.0,
                        help="with --class-size: the students join spread over this many seconds")
    args = parser.parse_args(argv)
    if args.class_size:
        return class_run(args)
    if args.long_tokens is None:
        args.long_tokens = 4 * args.max_new_tokens
    if not 0 <= args.long_share <= 1 or args.long_tokens < args.max_new_tokens:
        parser.error("--long-share must be from 0 to 1 and --long-tokens at least --max-new-tokens")
    url, close, expected = serve(args.model, args.long_tokens, args.sessions)
    records, lock = [], threading.Lock()
    watch = RssWatch(args.max_rss_growth_mb)
    deadline = time.monotonic() + args.max_seconds
    t0 = time.monotonic()
    lengths = (args.max_new_tokens, args.long_tokens)
    threads = [threading.Thread(target=session, args=(url, i, args.requests, lengths, args.long_share,
                                                      random.Random(args.seed * 1000 + i), expected, deadline,
                                                      records, lock), daemon=True) for i in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic() + args.grace_seconds))
    seconds = time.monotonic() - t0
    unfinished = sum(t.is_alive() for t in threads)
    report = report_of(records, args, seconds, unfinished, watch.stop())
    if unfinished:
        print_stacks()  # where the stuck sessions and serving's threads wait
        for job in SERVED["server"].jobs.of():  # the run is over: let the handlers end, so the process can
            job.end("stopped")
    close()
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**report, "records": records}, indent=1) + "\n")
    ok = (report["failed"] == 0 and report["crossed"] == 0 and report["unfinished_sessions"] == 0 and report["left"] == 0
          and report["stops"]["ran_in_full"] == 0 and len(records) == args.sessions * args.requests
          and report["memory"]["within_limit"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
