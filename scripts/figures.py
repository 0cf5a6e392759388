"""`python scripts/figures.py [--check]`: the command every generated block cites. The tooling itself
lives in scripts/docs/ (figures.py and its helpers); this entry point only runs it."""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent / "docs"))
    runpy.run_path(str(Path(__file__).resolve().parent / "docs" / "figures.py"), run_name="__main__")
