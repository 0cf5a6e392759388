"""Every relative link of README.md and docs/*.md resolves, #anchors included, and every repository path
those pages write in a code span exists (scripts/docs/links.py),
and scripts/README.md's index names every script and every shipped JSON artifact (issue 51)."""

import re
from fnmatch import fnmatch
from pathlib import Path

import links

ROOT = Path(__file__).resolve().parents[2]


def test_every_relative_link_of_the_pages_resolves():
    assert len(links.pages()) >= 9  # README.md and the pages of docs/
    assert [p for page in links.pages() for p in links.broken(page)] == []


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "a.png").write_bytes(b"")
    (docs / "b.md").write_text("# Title\n\n## The `x@q4` level: cheaper, as a level\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "README.md"
    good = ("[b](docs/b.md) [b](docs/b.md#the-xq4-level-cheaper-as-a-level) [b](docs/b.md#twice-1) "
            "![a](assets/a.png) [web](https://example.org/x) [top](#top)\n\n# Top\n\n`[code](nowhere.md)`\n"
            "```\n[fenced](nowhere.md)\n```\n")
    assert links.broken(page, good) == []
    bad = good + "[gone](docs/gone.md) [anchor](docs/b.md#no-such) ![img](../assets/a.png) [here](#nowhere)\n"
    assert links.broken(page, bad) == ["README.md: docs/gone.md (no such file)",
                                       "README.md: docs/b.md#no-such (no heading '#no-such' in b.md)",
                                       "README.md: ../assets/a.png (no such file)",
                                       "README.md: #nowhere (no heading '#nowhere' in README.md)"]


def test_every_repository_path_in_a_code_span_exists():
    pages = links.path_pages()
    assert len(pages) >= 11 and all(p.exists() for p in pages)
    spans = [w for page in pages for w in links.span_paths(page.read_text(encoding="utf-8"))]
    assert len(spans) > 100  # the check reads the spans: the pages name over a hundred repository paths
    assert [p for page in pages for p in links.missing_paths(page)] == []


def test_a_stale_path_in_a_code_span_is_caught(tmp_path):
    for folder in ("hispec/engine/planning", "assets/bench", "docs", "scripts/docs"):
        (tmp_path / folder).mkdir(parents=True)
    for file in ("hispec/engine/planning/policy.py", "assets/bench/a.json", "scripts/docs/figures.py"):
        (tmp_path / file).write_text("")
    page = tmp_path / "docs" / "page.md"
    good = ("`hispec/engine/planning/policy.py` `engine/planning/policy.py:57` `assets/bench/*.json` "
            "`hispec/auto` `hispec/fixed@q4` `python scripts/figures.py` `scripts/docs/figures.py --check` "
            "`tests` `a/b` `lookup,full@a8`\n```\n`hispec/engine/gone.py`\n```\n")
    assert links.missing_paths(page, good, root=tmp_path) == []
    bad = good + "`hispec/engine/policy.py` and `engine/costs.py` and `assets/bench/*.svg` and `docs/made_up.md`\n"
    assert links.missing_paths(page, bad, root=tmp_path) == [
        "page.md: `hispec/engine/policy.py` (no such path in the repository)",
        "page.md: `engine/costs.py` (no such path in the repository)",
        "page.md: `assets/bench/*.svg` (no such path in the repository)",
        "page.md: `docs/made_up.md` (no such path in the repository)"]


def unnamed(index: str, paths: list[Path]) -> list[str]:
    """The paths whose file name the index neither names nor matches with one of its `...*...` patterns."""
    patterns = [Path(p).name for p in re.findall(r"`([^`\s]*\*[^`\s]*)`", index)]
    return [p.name for p in paths if p.name not in index and not any(fnmatch(p.name, pat) for pat in patterns)]


def test_the_scripts_index_names_every_script_and_every_shipped_artifact():
    index = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
    scripts = [p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts]
    assert len(scripts) > 20 and unnamed(index, scripts) == []
    artifacts = [p for p in (ROOT / "assets").rglob("*.json*") if "exits" not in p.parts]
    assert len(artifacts) > 30 and unnamed(index, artifacts) == [], "scripts/README.md: say which command made it"
    # the check catches an artifact or a script the index does not name
    assert unnamed(index, [Path("assets/bench/new_run.json"), Path("scripts/measure/new.py")]) == ["new_run.json",
                                                                                                  "new.py"]
    assert unnamed(index, [Path("assets/policy/priors_new.json")]) == []  # `assets/policy/priors_*.json`


def opening_problems(readme: str) -> list[str]:
    """What the README must do (issue 51): fit in a few screens, and say in its opening paragraphs what
    the default runs and where the paper's exit hierarchy went."""
    body = readme.split("\n---\n", 1)[-1]  # after the Space's front matter
    opening = body[:body.index("\n## ")]
    out = [] if len(readme.splitlines()) <= 350 else [f"{len(readme.splitlines())} lines, over 350"]
    out += [f"the opening does not name {w!r}" for w in ("lookup", "4-bit model", "exact float32 model", "Teaching")
            if w not in opening]
    return out


def test_the_readme_fits_and_opens_with_what_the_default_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("---\ntitle: HiSpec\n") and "\napp_file: app.py\n" in readme  # the Space's front matter
    assert opening_problems(readme) == []
    assert "bash scripts/setup.sh -- python3 app.py" in readme and "bash scripts/setup.sh --dev -- python3 -m pytest" in readme
    # the check catches a README that grew or lost its opening
    assert opening_problems(readme + "x\n" * 400) == [f"{len(readme.splitlines()) + 400} lines, over 350"]
    assert opening_problems(readme.replace("Teaching", "Classroom")) == ["the opening does not name 'Teaching'"]
