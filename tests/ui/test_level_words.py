"""Words by the run's levels (issue 58, item 7): the legend under a run names its levels ('exit 4', 'the 4-bit
full model'), not 'the intermediate verifier', with the colours unchanged; "How it works" opens with the default
run and sends the reader to the Teaching preset for the exit hierarchy."""

import html
import re

from hispec.runs.trace import LEGEND
from ui import render
from ui.page import HOW_IT_WORKS


def items(legend: str) -> dict[str, tuple[str, str]]:
    """The legend's (label, meaning) by state class."""
    found = re.findall(r'<span class="hs-tok hs-([\w-]+)">(.*?)</span><span class="hs-legend-text">(.*?)</span>',
                       legend)
    return {cls: (label, meaning) for cls, label, meaning in found}


def test_the_default_runs_legend_names_the_4bit_model_and_keeps_the_colours():
    legend = render.legend_html({cls: 1 for cls, _, _ in LEGEND}, ("lookup", "full@a8"))
    shown = items(legend)
    assert list(shown) == [cls for cls, _, _ in LEGEND]  # every state, in order, with its own colour class
    assert "verifier" not in legend and "draft exit" not in legend
    four_bit = "4-bit, int8-activation full model"
    assert shown["verify-rejected"][0] == f"rejected by {four_bit}"
    assert shown["verify-wrote"][0] == f"{four_bit}&#x27;s token"
    assert f"accepted by the {four_bit}, waiting for the full model" in shown["tentative"][1]
    assert shown["drafted"][1].startswith(f"proposed by lookup or the {four_bit}")
    assert f"drafted by the {four_bit}" in shown["precision"][1] and "(1)" in shown["precision"][1]


def test_an_exit_hierarchys_legend_names_its_exits_and_says_which_states_cannot_happen():
    shown = items(render.legend_html(None, (2, 4)))
    assert shown["verify-rejected"][0] == "rejected by exit 4" and shown["verify-wrote"][0] == "exit 4&#x27;s token"
    assert shown["tentative"][1] == "accepted by exit 4, waiting for the full model"
    assert shown["copied"][1].startswith("not in this run") and shown["precision"][1].startswith("not in this run")
    single = items(render.legend_html(None, ("lookup", 4)))
    assert single["drafted"][1].startswith("proposed by lookup or exit 4")
    alone = items(render.legend_html(None, (2,)))  # layerskip: nothing between exit 2 and the full model
    assert alone["tentative"][1] == "not in this run: no level sits between exit 2 and the full model"
    # the run's levels not known yet (the page's first legend, How it works): the roles' general words
    assert "intermediate verifier" in render.legend_html() and items(render.legend_html()) == \
        {cls: (html.escape(label), html.escape(meaning)) for cls, label, meaning in LEGEND}


def test_how_it_works_opens_with_the_default_run_and_points_to_the_teaching_preset():
    first = " ".join(HOW_IT_WORKS.split("\n\n")[0].split())
    assert "lookup" in first and "4-bit model" in first and "float32 model" in first
    assert first.index("lookup") < first.index("4-bit model") < first.index("float32 model")
    assert "Teaching" in HOW_IT_WORKS and "HiSpec's own" not in HOW_IT_WORKS
    teaching = HOW_IT_WORKS.index("Teaching")
    assert HOW_IT_WORKS.index("exit") > HOW_IT_WORKS.index("4-bit model")  # the exits come after the default
    assert "intermediate" in HOW_IT_WORKS[teaching - 600:teaching + 600]  # the exit hierarchy is where it points
