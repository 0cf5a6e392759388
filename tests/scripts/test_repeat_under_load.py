"""scripts/measure/repeat_under_load.py counts what it says: a test that fails once in the series fails the
series, a skipped run is not a pass, and the report records every run and the load it ran under."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("repeat_under_load", ROOT / "scripts" / "measure" / "repeat_under_load.py")
repeat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repeat)


def write_test(folder: Path, body: str) -> str:
    path = folder / "test_sample.py"
    path.write_text("import os, pytest\n" + body)
    return f"{path}::test_sample"


def test_a_series_passes_only_when_every_run_passes(tmp_path):
    # fails on its second run only: the count file says which run this is
    count = tmp_path / "count"
    node = write_test(tmp_path, f"def test_sample():\n    p = {str(count)!r}\n"
                                "    n = int(open(p).read()) if os.path.exists(p) else 0\n"
                                "    open(p, 'w').write(str(n + 1))\n    assert n != 1\n")
    out = tmp_path / "report.json"
    assert repeat.main([node, "--times", "3", "--busy", "1", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["counts"] == {"passed": 2, "failed": 1, "skipped": 0}
    assert [r["outcome"] for r in report["runs"]] == ["passed", "failed", "passed"]
    assert any("assert n != 1" in line or "AssertionError" in line for line in report["runs"][1]["tail"])
    assert report["load"]["processes"] == 1 and report["host"]["cpus"] and "commit" in report


def test_a_skipped_run_is_not_a_pass(tmp_path):
    node = write_test(tmp_path, "def test_sample():\n    pytest.skip('no browser here')\n")
    assert repeat.main([node, "--times", "1", "--busy", "0"]) == 1
    good = write_test(tmp_path, "def test_sample():\n    assert True\n")
    assert repeat.main([good, "--times", "2", "--busy", "0"]) == 0
