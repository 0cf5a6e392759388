"""glibc's malloc arenas on a Space: at most two, set before the process starts.

Under the load test the server's resident memory grew from 1,856 to 3,088 MB over about 500 requests
while Python's own object counts stayed flat: glibc gives threads that contend for the heap arenas of
their own (up to eight per core) and keeps what is freed in them. MALLOC_ARENA_MAX=2 about halved it.
glibc reads it once, as the process starts, so on a Space `arenas_limited_on_spaces()` (app.py, before
anything is loaded) starts the same command again with it set (exec: the same process id); an owner's own
MALLOC_ARENA_MAX is kept. The load test reports the resident memory it reached (scripts/measure/load_test.py).
"""

from __future__ import annotations

import os
import sys

ARENAS = "MALLOC_ARENA_MAX"
LIMIT = "2"


def arenas_limited_on_spaces(env=None, execv=os.execve) -> bool:
    """On a Space under glibc without MALLOC_ARENA_MAX: run this command again with it set to 2 (does not
    return). False when nothing was to be done."""
    env = os.environ if env is None else env
    if not env.get("SPACE_ID") or env.get(ARENAS) or not _glibc():
        return False
    sys.stdout.flush(), sys.stderr.flush()
    execv(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**env, ARENAS: LIMIT})
    return True


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # not glibc (musl, macOS, Windows)
        return False
