"""Every figure in the README's prose is checked (issue 33, item 5): in a generated block of its
section, shown by its section's artifact, tied to an artifact by a function, or listed with why it
has none (scripts/docs/figures_prose.py); `python scripts/figures.py --check` fails otherwise."""

import json
import re
import shutil

import pytest

import figures_prose as prose
from figures import README, main

TEXT = README.read_text(encoding="utf-8")


def test_every_figure_in_the_readme_prose_is_checked():
    assert prose.problems(TEXT) == []
    found, _ = prose.prose_figures(TEXT)
    assert len(found) > 100  # the check sees the prose's figures, not a handful
    assert len(prose.TIES) >= 15


def test_figures_are_ratios_percentages_speeds_times_and_their_ranges():
    text = ("1.53× and 5x, 37%, ±5%, 0.91–0.93×, 11-75×, 57 tok/s, 56.9 tokens/s, 13.7 ms, 0.3–0.6 ms; "
            "not 2 × 128, 0x1f, v1.5, 12 tokens, 20 s or 98 MB")
    assert prose.FIGURE.findall(text) == ["1.53×", "5x", "37%", "±5%", "0.91–0.93×", "11-75×", "57 tok/s",
                                          "56.9 tokens/s", "13.7 ms", "0.3–0.6 ms"]


def _one_digit_changed(text: str, figure: str) -> str:
    assert text.count(figure) >= 1, figure
    at = text.index(figure)
    digit = re.search(r"\d", figure).start()
    old = figure[digit]
    return text[:at + digit] + str((int(old) + 1) % 10) + text[at + digit + 1:]


@pytest.mark.parametrize("figure", ["11-92×", "0.93–0.94×", "lift agreement to 39–41%", "(48%)", "costs 8.8 ms"])
def test_a_changed_digit_in_a_tied_figure_is_caught(figure):
    stale = _one_digit_changed(TEXT, figure)
    found = prose.problems(stale)
    assert found, figure
    assert any("tied quote not in the README" in p for p in found), found  # the quote no longer holds


def test_a_figure_copied_from_a_block_is_caught_when_it_drifts():
    # "(0.98×)" in the Results prose is the levels-report block's figure for the same level list with fixed rounds
    where = TEXT.index("It beats the same level list with fixed rounds")
    piece = TEXT[where:where + 120]
    assert "(0.98×)" in piece
    stale = TEXT[:where] + piece.replace("(0.98×)", "(0.78×)", 1) + TEXT[where + 120:]
    found = prose.problems(stale)
    assert len(found) == 1 and "0.78× (## Results) is in neither block beside it" in found[0], found
    # only the blocks beside a figure count, not every block of its section (the Results blocks hold
    # about 70 ratios, so a drifting copy would often land on one of them)
    figures, in_blocks = prose.prose_figures(TEXT)
    mine = next(f for f in figures if f.text == "0.98×" and f.line == TEXT.count("\n", 0, where) + 2)
    assert "1.81×" in in_blocks["## Results"] and "1.81×" not in mine.near
    # the rule's limit: a copy that drifts onto another figure of a block beside it passes; ties are stricter
    assert "0.97×" in mine.near


def test_a_new_unchecked_figure_and_a_dropped_listed_quote_are_caught():
    new = TEXT.replace("## Results\n", "## Results\n\nThe engine is now 2.7× faster than before.\n", 1)
    assert any("2.7× (## Results) is in neither block beside it" in p for p in prose.problems(new))
    gone = TEXT.replace("and said 12%", "and said something else", 1)
    assert prose.problems(gone) == ["untied quote not in the README (take it off the list): 'and said 12%'"]


def test_a_tie_reports_an_artifact_that_now_gives_another_figure(tmp_path):
    """The artifact moves, the README does not: the tie names the artifact and the figure it now gives."""
    root = tmp_path / "repo"
    shutil.copytree(prose.ROOT / "assets", root / "assets",  # the JSON artifacts only
                    ignore=lambda folder, names: [n for n in names if "." in n and not n.endswith(".json")])
    path = root / "assets" / "bench" / "q4_cpu_default.json"
    report = json.loads(path.read_text())
    report["memory_bound"]["q4"]["weight_bytes"] //= 2  # 4-bit weights half the size: 11.1x the bytes
    path.write_text(json.dumps(report))
    found = prose.problems(TEXT, root)
    assert any(p.startswith("assets/bench/q4_cpu_default.json now gives 11.1×") for p in found), found


def test_the_check_command_fails_on_a_stale_prose_figure(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(_one_digit_changed(TEXT, "11-92×"), encoding="utf-8")
    assert main(["--check", "--readme", str(readme)]) == 1
    assert "figures: prose: tied quote not in the README: 'but take 11-92×" in capsys.readouterr().err
    assert main(["--check"]) == 0
