"""The kernel-sensitive tests on other CPU kernels: machines of this project's kind differ (with or
without AVX-512), and a test that passes only on the kernels of the host it was written on fails
on the next one in the last bit. This reruns those test files in a subprocess with ATen and oneDNN
held to AVX2, which every x86-64 host this project runs on has."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Exit heads vs the final head, the lean path vs transformers' layers, graph replays vs eager passes,
# attention heads' cached vs one-pass states: where different kernels meet.
FILES = ["tests/model/test_exit_heads.py", "tests/model/test_lean.py", "tests/model/test_graphs.py",
         "tests/model/test_attention_heads.py",
         "tests/model/test_q4.py", "tests/model/test_a8.py"]  # there the 4-bit kernel's AVX2 build runs every method too


@pytest.mark.slow_isa
def test_kernel_sensitive_tests_pass_on_avx2_kernels():
    """About 2 minutes on 2 cores, so it runs by default; select or skip it with -m slow_isa /
    -m "not slow_isa"."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "not browser", *FILES]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1200)
    assert proc.returncode == 0, f"{' '.join(cmd[1:])} failed on AVX2 kernels:\n{proc.stdout[-6000:]}"
