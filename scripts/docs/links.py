"""Every relative link of README.md and docs/*.md resolves: the file (or folder) exists, and a
``#anchor`` names a heading of the Markdown page it points to (GitHub's anchors: the heading in
lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` ... for repeats).

Repository paths written in code spans are checked too, on those pages and on scripts/README.md and
assets/how_it_works.md: a span whose first word contains '/' and starts with a top-level folder of the
repository (``hispec/engine/planning/policy.py``, ``assets/bench/*.json``) must name a file or folder
that exists (a glob: at least one); a span starting with a folder of the package (``engine/lookup.py``)
is read under hispec/, and a path may also be relative to its page (scripts/README.md's
``docs/figures.py``). A ``::test`` or ``:line`` suffix is dropped. Method names (``hispec/auto``,
``hispec/fixed@q4``) are not paths.

    python scripts/docs/links.py        (exits 1, naming each broken link)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


METHOD = re.compile(r"^hispec/(auto|fixed)(@\w+)?$")  # method names, not paths


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def path_pages(root: Path = ROOT) -> list[Path]:
    """The pages whose code-span paths are checked: the linked pages and the other Markdown that names files."""
    return [*pages(root), root / "scripts" / "README.md", root / "assets" / "how_it_works.md"]


def span_paths(text: str, root: Path = ROOT) -> list[str]:
    """The repository paths the text writes in code spans (outside fenced blocks), as written."""
    tops = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    package = {p.name for p in (root / "hispec").iterdir() if p.is_dir() and not p.name.startswith("_")}
    out = []
    for span in CODE.findall(FENCE.sub("", text)):
        words = span.strip("`").split()
        word = words[0].split("::")[0] if words else ""
        if "/" in word and word.split("/")[0] in tops | package and not METHOD.match(word):
            out.append(word)
    return out


def missing_paths(page: Path, text: str | None = None, root: Path = ROOT) -> list[str]:
    """The page's code-span paths that name nothing in the repository, each as 'PAGE: `PATH` (why)'."""
    text = page.read_text(encoding="utf-8") if text is None else text
    out = []
    for word in span_paths(text, root):
        path = re.sub(r":\d+(-\d+)?$", "", word)
        bases = (root, root / "hispec", page.parent)  # the repository, the package, the page's own folder
        found = any(any(b.glob(path.rstrip("/"))) if "*" in path else (b / path).exists() for b in bases)
        if not found:
            out.append(f"{page.name}: `{word}` (no such path in the repository)")
    return out


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are examples, not links)."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    out, seen = set(), {}
    for m in HEADING.finditer(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken(page: Path, text: str | None = None) -> list[str]:
    """The page's relative links that do not resolve, each as 'PAGE: TARGET (why)'."""
    text = page.read_text(encoding="utf-8") if text is None else text
    out = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        if not path:  # an anchor of the page itself
            if anchor not in anchors(text):
                out.append(f"{page.name}: {target} (no heading '#{anchor}' in {page.name})")
            continue
        file = (page.parent / path).resolve()
        if not file.exists():
            out.append(f"{page.name}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            out.append(f"{page.name}: {target} (no heading '#{anchor}' in {file.name})")
    return out


def main() -> int:
    problems = [p for page in pages() for p in broken(page)]
    problems += [p for page in path_pages() for p in missing_paths(page)]
    for p in problems:
        print(f"links: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
