"""Makes assets/prompts/summaries.jsonl: the documents of the 'summarize' prompt set, shipped as data.

The set used to be read at run time from the running interpreter's pydoc topics and the installed
packages' READMEs, with the versions in the ids, so a split naming those ids existed only on one
interpreter (issue 57: Debian 12's Python 3.11.2 failed the fresh split). The documents are now a
fixed snapshot: ids name the document only (summarize-pydoc-KEY, summarize-readme-PACKAGE), each line
says where its text came from (`source`) and which id it had before (`formerly`, as older
artifacts name it). Run this only to rebuild the snapshot on purpose; it refuses to change the text
of a shipped document unless --replace is given (a changed text is a new prompt set).

Sources: CPython's reference documentation (pydoc_data.topics; PSF licence) and the long
descriptions (README prose, without code) of packages pinned in requirements.txt, each under its own
licence (torch BSD-3, transformers/accelerate/gradio/huggingface_hub/tokenizers Apache-2.0, numpy BSD-3,
tqdm MPL-2.0/MIT, plotly MIT, gguf MIT).

    python scripts/data/summaries.py [--out assets/prompts/summaries.jsonl] [--replace]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hispec.data.prompts import SUMMARIES_FILE, read_summaries  # noqa: E402

TOPICS = ("augassign", "binary", "booleans", "class", "dict", "exceptions", "for", "global", "identifiers",
          "in", "numeric-types", "objects", "operator-summary", "raise", "slicings", "subscriptions",
          "typesmethods", "typesseq-mutable")
PACKAGES = ("torch", "transformers", "accelerate", "gradio", "numpy", "tqdm", "huggingface_hub", "plotly",
            "tokenizers", "gguf")
MIN_README_WORDS = 150


def readme_prose(markdown: str, max_words: int = 450) -> str:
    """The first paragraphs of prose of a README: no code, tables, HTML, images or badges."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"<!--.*?-->|<[^>]+>", "", text, flags=re.S)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)  # images and badges
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: keep their words
    paragraphs, words = [], 0
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.strip().splitlines()]
        if not lines or any(ln.startswith(("|", "    ", ">>>", "$ ", "pip ")) for ln in lines):
            continue
        para = " ".join(ln.lstrip("#*-> ").strip() for ln in lines).strip()
        if len(para.split()) < 8:  # headings, badges left over, one-liners
            continue
        paragraphs.append(para)
        words += len(para.split())
        if words >= max_words:
            break
    return "\n\n".join(paragraphs)


def documents() -> list[dict]:
    """The documents as this interpreter and these installed packages hold them."""
    from pydoc_data.topics import topics

    version = platform.python_version()
    out = [{"id": f"summarize-pydoc-{key}", "source": f"CPython {version} pydoc_data.topics[{key!r}]",
            "formerly": f"summarize-cpython{version}-{key}", "text": topics[key].strip()}
           for key in TOPICS if key in topics]
    for name in PACKAGES:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        prose = readme_prose(dist.metadata.get_payload() or dist.metadata.get("Description") or "")
        if len(prose.split()) >= MIN_README_WORDS:
            out.append({"id": f"summarize-readme-{name}", "source": f"the README of {name} {dist.version} (package metadata)",
                        "formerly": f"summarize-readme-{name}-{dist.version}", "text": prose})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(SUMMARIES_FILE))
    parser.add_argument("--replace", action="store_true", help="allow changing the text of a shipped document")
    args = parser.parse_args(argv)
    new = documents()
    if Path(args.out).is_file() and not args.replace:
        old = {d["id"]: d["text"] for d in read_summaries(Path(args.out))}
        changed = [d["id"] for d in new if d["id"] in old and old[d["id"]] != d["text"]]
        if changed:
            print(f"summaries: {len(changed)} shipped documents would change ({changed[0]}, ...); "
                  "pass --replace to make a new set on purpose", file=sys.stderr)
            return 2
    Path(args.out).write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in new), encoding="utf-8")
    print(f"summaries: {len(new)} documents -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
