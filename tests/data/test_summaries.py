"""The prompt sets do not depend on the interpreter that runs them (issue 57): the summaries are shipped
as data, their ids name no version, and every offline set and the fresh split load the same prompts on
every Python the machine has (Debian 12's python3 failed the fresh split when the summaries were read
from the running interpreter's pydoc topics)."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hispec.data.prompts import FRESH_NAME, SUMMARIES_FILE, load_sets, read_summaries

ROOT = Path(__file__).resolve().parents[2]
SETS = ("summarize", "humaneval", "sharegpt", "mtbench", FRESH_NAME)
LOAD = ("import json, sys\n"
        "from hispec.data.prompts import load_sets\n"
        "print(json.dumps({'python': sys.version.split()[0], 'sets': {s: {k: [[p.id, p.text] for p in v] "
        "for k, v in load_sets(s).items()} for s in sys.argv[1:]}}))\n")


def _pythons() -> dict[str, str]:
    """One interpreter per Python version found on this machine: this one, Debian's, any on PATH."""
    found = {}
    for exe in (sys.executable, "/usr/bin/python3", shutil.which("python3"), *(
            shutil.which(f"python3.{minor}") for minor in range(10, 15))):
        if not exe or not os.access(exe, os.X_OK) or exe in found.values():
            continue
        version = subprocess.run([exe, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True).stdout.strip()
        if version and version not in found and version >= "3.10":
            found[version] = exe
    return found


def test_summaries_are_shipped_documents_whose_ids_name_no_version():
    docs = read_summaries()
    assert len(docs) >= 20 and len({d["id"] for d in docs}) == len(docs)
    for doc in docs:
        assert doc["id"].startswith(("summarize-pydoc-", "summarize-readme-")), doc["id"]
        assert not re.search(r"\d+\.\d+", doc["id"]), f"{doc['id']} names a version"
        assert doc["source"] and len(doc["text"].split()) >= 150
    prompts = load_sets("summarize")["summarize"]
    assert [p.id for p in prompts] == [d["id"] for d in docs]
    assert all(p.text.startswith("Summarize the following text") for p in prompts)


def test_a_missing_summaries_file_is_named(tmp_path, monkeypatch):
    import hispec.data.prompts as prompts
    from hispec.errors import ConfigError

    with pytest.raises(ConfigError, match="summaries.jsonl"):
        prompts.read_summaries(tmp_path / "summaries.jsonl")
    assert SUMMARIES_FILE.is_file()


def test_every_set_loads_the_same_prompts_on_every_python_here():
    pythons = _pythons()
    if len(pythons) < 2:
        pytest.skip(f"only one Python on this machine ({', '.join(pythons)}): nothing to compare")
    # the data packages are located, never imported: this environment's site-packages serve every interpreter
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]]),
           "PYTHONNOUSERSITE": "1"}
    answers = {}
    for version, exe in pythons.items():
        run = subprocess.run([exe, "-S", "-c", LOAD, *SETS], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=300)
        assert run.returncode == 0, f"Python {version} ({exe}) could not load the sets:\n{run.stderr[-2000:]}"
        answer = json.loads(run.stdout)
        assert answer["python"] == version
        answers[version] = answer["sets"]
    first, *others = answers
    for version in others:
        for name in SETS:
            assert answers[version][name] == answers[first][name], f"{name} differs between Python {first} and {version}"
