"""At most two malloc arenas on a Space (serving.memory): glibc reads MALLOC_ARENA_MAX as the process starts,
so the app starts its own command again with it set, before anything is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hispec.serving import memory

ROOT = Path(__file__).resolve().parents[2]
glibc = pytest.mark.skipif(not memory._glibc(), reason="MALLOC_ARENA_MAX is glibc's")


@glibc
def test_on_a_space_the_command_starts_again_with_two_arenas():
    calls = []
    assert memory.arenas_limited_on_spaces({"SPACE_ID": "a/b", "HOME": "/h"}, lambda *a: calls.append(a))
    (exe, argv, env), = calls
    assert exe == sys.executable and argv == [sys.executable, *sys.orig_argv[1:]]
    assert env == {"SPACE_ID": "a/b", "HOME": "/h", "MALLOC_ARENA_MAX": "2"}


def test_nothing_is_done_off_a_space_or_when_the_owner_set_it():
    def never(*args):
        raise AssertionError("started again")

    assert not memory.arenas_limited_on_spaces({}, never)
    assert not memory.arenas_limited_on_spaces({"SPACE_ID": "a/b", "MALLOC_ARENA_MAX": "4"}, never)


@glibc
def test_it_takes_effect_in_the_process_that_runs_on():
    """The real exec: the process that goes on has MALLOC_ARENA_MAX=2 in its environment from its start."""
    script = ("import os, sys; from hispec.serving.memory import arenas_limited_on_spaces; "
              "print('start', os.environ.get('MALLOC_ARENA_MAX'), flush=True); arenas_limited_on_spaces(); "
              "print('running', os.environ.get('MALLOC_ARENA_MAX'))")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | {"SPACE_ID": "a/b"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:3] == ["start None", "start 2", "running 2"], out


@glibc
def test_app_py_does_it_first_when_started():
    """app.py, started as a Space starts it, asks for the limit before anything heavy is imported."""
    script = ("import os, sys; sys.modules.update(gradio=None, torch=None); "  # imported first: an ImportError
              "os.execve = lambda exe, argv, env: (print('exec', env['MALLOC_ARENA_MAX'], flush=True), os._exit(0)); "
              "import runpy; runpy.run_path('app.py', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | {"SPACE_ID": "a/b"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "exec 2", out
