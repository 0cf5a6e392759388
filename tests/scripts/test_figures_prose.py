"""Every figure in the prose of README.md and docs/*.md is checked (issue 33, item 5; issue 51: every
page): in a generated block of its section, shown by its section's artifact, tied to an artifact by a
function, or listed with why it has none (scripts/docs/figures_prose.py); `python scripts/figures.py
--check` fails otherwise."""

import json
import re
import shutil

import pytest

import figures_prose as prose
from figures import DOCS, README, main, pages

PAGES = {("README.md" if p == README else f"docs/{p.name}"): t for p, t in pages().items()}
RESULTS = "docs/benchmarks.md"


def _one_digit_changed(text: str, figure: str) -> str:
    assert text.count(figure) >= 1, figure
    at = text.index(figure)
    digit = re.search(r"\d", figure).start()
    old = figure[digit]
    return text[:at + digit] + str((int(old) + 1) % 10) + text[at + digit + 1:]


def _changed_everywhere(figure: str) -> dict[str, str]:
    """The pages with the figure changed by one digit on every page that quotes it."""
    holders = [name for name, text in PAGES.items() if figure in text]
    assert holders, figure
    return {name: _one_digit_changed(text, figure) if name in holders else text for name, text in PAGES.items()}


def test_every_figure_in_the_prose_of_every_page_is_checked():
    assert prose.problems(PAGES) == []
    found = [f for text in PAGES.values() for f in prose.prose_figures(text)[0]]
    assert len(found) > 100  # the check sees the prose's figures, not a handful
    assert len(prose.TIES) >= 15
    assert len(PAGES) >= 9 and "docs/DESIGN.md" in PAGES


def test_figures_are_ratios_percentages_speeds_times_and_their_ranges():
    text = ("1.53× and 5x, 37%, ±5%, 0.91–0.93×, 11-75×, 57 tok/s, 56.9 tokens/s, 13.7 ms, 0.3–0.6 ms; "
            "not 2 × 128, 0x1f, v1.5, 12 tokens, 20 s or 98 MB")
    assert prose.FIGURE.findall(text) == ["1.53×", "5x", "37%", "±5%", "0.91–0.93×", "11-75×", "57 tok/s",
                                          "56.9 tokens/s", "13.7 ms", "0.3–0.6 ms"]


@pytest.mark.parametrize("figure", ["11-92×", "0.93–0.94×", "lift agreement to 39–41%", "(48%)", "costs 8.8 ms",
                                    "`MIN_GAIN` (1.15x)", "measured it at 0.64× plain"])
def test_a_changed_digit_in_a_tied_figure_is_caught(figure):
    found = prose.problems(_changed_everywhere(figure))
    assert found, figure
    assert any("tied quote not in the README or docs/" in p for p in found), found  # the quote no longer holds


def test_a_figure_copied_from_a_block_is_caught_when_it_drifts():
    # "(0.98×)" in the Results prose is the levels-report block's figure for the same level list with fixed rounds
    text = PAGES[RESULTS]
    where = text.index("It beats the same level list with fixed rounds")
    piece = text[where:where + 120]
    assert "(0.98×)" in piece
    stale = text[:where] + piece.replace("(0.98×)", "(0.78×)", 1) + text[where + 120:]
    found = prose.problems({**PAGES, RESULTS: stale})
    assert len(found) == 1 and "0.78× (## Results) is in neither block beside it" in found[0], found
    assert found[0].startswith(f"{RESULTS}:")  # the page and its line
    # only the blocks beside a figure count, not every block of its section (the Results blocks hold
    # about 70 ratios, so a drifting copy would often land on one of them)
    figures, in_blocks = prose.prose_figures(text)
    mine = next(f for f in figures if f.text == "0.98×" and f.line == text.count("\n", 0, where) + 2)
    assert "1.81×" in in_blocks["## Results"] and "1.81×" not in mine.near
    # the rule's limit: a copy that drifts onto another figure of a block beside it passes; ties are stricter
    assert "0.97×" in mine.near


def test_the_readme_figures_are_the_headline_block_s():
    """The README's prose quotes the headline block beside it: a copy that drifts is caught there too."""
    text = PAGES["README.md"]
    assert "1.03× / 1.06× plain float32" in text
    found = prose.problems({**PAGES, "README.md": text.replace("1.03× / 1.06× plain float32", "1.23× / 1.06× plain float32", 1)})
    assert len(found) == 1 and found[0].startswith("README.md:") and "1.23× (## How fast)" in found[0], found


def test_a_new_unchecked_figure_and_a_dropped_listed_quote_are_caught():
    new = PAGES[RESULTS].replace("## Results\n", "## Results\n\nThe engine is now 2.7× faster than before.\n", 1)
    assert any("2.7× (## Results) is in neither block beside it" in p for p in prose.problems({**PAGES, RESULTS: new}))
    gone = {n: t.replace("and said 12%", "and said something else", 1) for n, t in PAGES.items()}
    assert prose.problems(gone) == ["untied quote not in the README or docs/ (take it off the list): 'and said 12%'"]


def test_a_tie_reports_an_artifact_that_now_gives_another_figure(tmp_path):
    """The artifact moves, the page does not: the tie names the artifact and the figure it now gives."""
    root = tmp_path / "repo"
    shutil.copytree(prose.ROOT / "assets", root / "assets",  # the JSON artifacts only
                    ignore=lambda folder, names: [n for n in names if "." in n and not n.endswith(".json")])
    path = root / "assets" / "bench" / "q4_cpu_default.json"
    report = json.loads(path.read_text())
    report["memory_bound"]["q4"]["weight_bytes"] //= 2  # 4-bit weights half the size: 11.1x the bytes
    path.write_text(json.dumps(report))
    found = prose.problems(PAGES, root)
    assert any(p.startswith("assets/bench/q4_cpu_default.json now gives 11.1×") for p in found), found


def test_the_check_command_fails_on_a_stale_prose_figure_on_any_page(tmp_path, capsys):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    readme = tmp_path / "README.md"
    shutil.copy(README, readme)
    assert main(["--check", "--readme", str(readme), "--docs", str(docs)]) == 0
    page = docs / "precision.md"
    page.write_text(_one_digit_changed(page.read_text(encoding="utf-8"), "11-92×"), encoding="utf-8")
    capsys.readouterr()
    assert main(["--check", "--readme", str(readme), "--docs", str(docs)]) == 1
    assert "figures: prose: tied quote not in the README or docs/: 'but take 11-92×" in capsys.readouterr().err
    assert main(["--check"]) == 0
