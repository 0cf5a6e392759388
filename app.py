"""HiSpec demo: watch hierarchical speculative decoding token by token.

Run `python app.py` (127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override; the limits and
the model allow-list are HISPEC_* settings, see README "Hosting it in public"). This file only wires
the page: the layout is ui/page.py, the panels (each with its handlers, wired by name) ui/panels/, and every
request is served by hispec/serving (admission, limits, queue, the model's turn, Stop, the time limit).
"""

from __future__ import annotations

if __name__ == "__main__":  # before anything is loaded: glibc reads MALLOC_ARENA_MAX once, as the process starts
    from hispec.serving.memory import arenas_limited_on_spaces

    arenas_limited_on_spaces()  # on a Space: this command again, with at most two malloc arenas

try:  # ZeroGPU on Hugging Face Spaces: `spaces` must be imported before torch
    import spaces  # noqa: F401
except ImportError:  # pragma: no cover - spaces is in requirements, but the app runs without it
    spaces = None

import logging
import os
import sys
from pathlib import Path

import gradio as gr

from hispec.errors import HiSpecError
from hispec.evaluation import published
from hispec.model.default_gguf import default_gguf_present, fetch_default_gguf
from hispec.runs.lessons import load_lessons
from hispec.runs.runner import warm_up
from hispec.serving.caller import forwarded_headers_left_to_serving
from hispec.serving.edge import Edge
from hispec.serving.limits import LAYERSKIP_CHECKPOINT, Limits, on_spaces
from hispec.serving.registry import ModelRegistry
from hispec.serving.session import Server
from ui import labels, token_story
from ui.bench_tab import BenchTab
from ui.model_view import model_defaults, model_info, settings_by_method, trained_layers
from ui.page import Setup, build_page
from ui.panels.compare import Compare
from ui.panels.generate import Generate
from ui.panels.lesson import Lesson
from ui.panels.model import Model
from ui.panels.steps import Steps
from ui.panels.what_if import WhatIf
from ui.panels.why import Why

ASSETS = Path(__file__).parent / "assets"
TITLE = "HiSpec: hierarchical speculative decoding"


def build(server: Server, model_choices: list[str] | None = None, lessons: list | None = None) -> gr.Blocks:
    """The page for a server whose start model is loaded; `model_choices`: what the model box offers
    (only names the server allows are kept); `lessons`: the recorded runs it replays (None: those shipped)."""
    lessons = load_lessons() if lessons is None else lessons
    lm = server.registry.get(server.default_model)
    allowed = server.limits.allowed_models
    choices = [m for m in (model_choices or [server.default_model]) if m in allowed] or [server.default_model]
    setup = Setup(server.default_model, choices, "*" in allowed, lm.ee.num_layers, model_defaults(lm),
                  trained_layers(lm), settings_by_method(lm), model_info(server.default_model, lm),
                  server.limits.max_new_tokens, server.limits.max_prompt_chars, server.limits.describe(),
                  labels.default_levels(lm.ee.formats()), tuple(lesson.title for lesson in lessons))
    with gr.Blocks(title=TITLE) as demo:
        page = build_page(setup)
        for panel in panels(server, lessons):
            panel.wire(page)
    return demo


def panels(server: Server, lessons: list = ()) -> list:
    """The page's panels (ui.panels), each wiring its own components by name; Why and Steps follow every run
    of Generate and every lesson replayed, and the What-if's result is drawn by Why. The Benchmark tab comes first: it builds its own
    components as it wires, before /generate's (gr.api) are made, so every component keeps its id."""
    why = Why(server, published.load(ASSETS / "published_points.json"))
    steps = Steps(server)
    return [BenchTab(server, max_new_tokens=server.limits.max_new_tokens), Generate(server, follow=(why, steps)),
            Lesson(lessons, follow=(why, steps)), why, WhatIf(server, why), Compare(server), steps, Model(server)]


def model_choices() -> list[str]:
    return (["default"] if default_gguf_present() else []) + [LAYERSKIP_CHECKPOINT]


def launch_kwargs(server: Server) -> dict:
    """What launch() takes besides the address: the page's look, and the serving edge (serving.edge:
    every request stamped with its arrival, the queue-less Stop at /hispec/stop, the per-address
    limit on joining the queue), with uvicorn told to believe no X-Forwarded-For (serving.caller
    takes the address from the proxies the operator trusts)."""
    forwarded_headers_left_to_serving()
    from starlette.middleware import Middleware

    # Gradio runs a page's handlers in a pool of max_threads (40 by default): a run's update stream holds a
    # thread while it waits for its turn, so a class filling serving's queue (Limits.queue_size) and the seats
    # beside it needs more, else the rest wait in Gradio's queue where serving's places and limits never reach
    threads = max(40, 2 * server.limits.queue_size + 16)
    return dict(css=(ASSETS / "app.css").read_text(), theme=gr.themes.Soft(), head=token_story.EXPLAIN_JS,
                max_threads=threads, app_kwargs={"middleware": [Middleware(Edge, server=lambda: server)]})


def close(demo: gr.Blocks) -> None:
    """demo.close() from a thread other than the server's. Gradio's close sets an asyncio.Event from the calling
    thread; when the event loop touches that event's waiters at the same moment, set() raises "deque mutated
    during iteration" after the app is already marked stopped, so close() would return early and leave the port
    open (seen once in a load test's teardown). Here the server is closed all the same."""
    try:
        demo.close()
    except RuntimeError:
        if getattr(demo, "server", None) is not None:
            demo.server.close()


def serve(registry: ModelRegistry, model_name: str, limits: Limits) -> Server:
    """The server of a registry whose start model is loaded; the operator's model is allowed."""
    return Server(registry, limits.allowing(model_name), default_model=model_name)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    model_name = os.environ.get("HISPEC_MODEL", "default")  # missing, it says how to install it (never a fallback)
    limits = Limits.from_env()
    registry = ModelRegistry(device=os.environ.get("HISPEC_DEVICE", "auto"), prepare=warm_up)
    say = lambda m: print(f"HiSpec: {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        if on_spaces():  # a Space installs requirements.txt only: the default model's file is fetched here
            fetch_default_gguf(progress=say)
        say(f"loading {model_name}…")
        registry.add(model_name, registry.get(model_name, progress=say))
    except HiSpecError as exc:
        sys.exit(f"HiSpec: {exc}")
    server = serve(registry, model_name, limits)
    demo = build(server, model_choices())
    demo.queue(max_size=max(64, 8 * limits.queue_size), default_concurrency_limit=None).launch(**launch_kwargs(server))


if __name__ == "__main__":
    main()
