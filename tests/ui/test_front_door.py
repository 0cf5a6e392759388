"""The page's first screen says what the default runs and how fast it measured, from the shipped report."""

import json
import shutil

from ui import front_door


def test_the_first_screen_says_what_the_default_runs_and_its_measured_speed_from_the_report(tmp_path):
    report = json.loads((front_door.BENCH / front_door.DEFAULT_REPORT).read_text())
    ratio = report["summary"]["all"]["methods"][front_door.DEFAULT_METHOD]["vs_reference"]["geomean"]
    text = front_door.intro()
    assert "lookup" in text and "4-bit model" in text and "exact float32 model" in text
    assert "round by round" in text and "adaptive policy" in text
    assert f"**{ratio:.2f}× plain decoding** end to end" in text and front_door.DEFAULT_REPORT in text
    decode = report["summary"]["all"]["methods"][front_door.DEFAULT_METHOD]["vs_reference_decode"]["geomean"]
    assert f"{decode:.2f}× after the first token" in text
    # the figure is the developers' machine's, not the serving host's; float32 is the file dequantised
    assert "developers' machine, not on this server" in text and "Measured here" not in text
    assert "GGUF file dequantised to float32" in text
    assert "Teaching" in text and "slower than plain decoding" in text and "agree with the full model only" in text
    # read from the file, not typed in: another figure in the report is another figure on the page
    shutil.copy(front_door.BENCH / front_door.EXITS_REPORT, tmp_path / front_door.EXITS_REPORT)
    report["summary"]["all"]["methods"][front_door.DEFAULT_METHOD]["vs_reference"]["geomean"] = 9.87
    (tmp_path / front_door.DEFAULT_REPORT).write_text(json.dumps(report))
    assert "**9.87× plain decoding**" in front_door.intro(tmp_path)


def test_without_the_reports_the_first_screen_still_says_what_runs(tmp_path):
    text = front_door.intro(tmp_path)
    assert "4-bit model" in text and "Teaching" in text and "× plain decoding" not in text
