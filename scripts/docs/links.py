"""Every relative link of README.md and docs/*.md resolves: the file (or folder) exists, and a
``#anchor`` names a heading of the Markdown page it points to (GitHub's anchors: the heading in
lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` ... for repeats).

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


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


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
    for p in problems:
        print(f"links: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
