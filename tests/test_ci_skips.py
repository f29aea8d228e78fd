"""tests/ci_skips.py: under CI a skip fails unless its reason is one CI may skip for."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SAMPLE = '''
import pytest
def test_missing_tool():
    pytest.skip("`nft` is not installed; install with: sh tests/host-packages.sh")
@pytest.mark.skipif(True, reason="not applicable: root ignores directory permissions")
def test_root_only():
    pass
def test_gpu():
    pytest.skip("needs a GPU: no CUDA device")
@pytest.mark.xfail(reason="known")
def test_known():
    assert False
def test_fine():
    pass
'''
MODULE_SKIP = 'import pytest\nyaml_x = pytest.importorskip("no_such_module_here")\ndef test_x():\n    pass\n'


def run(tmp_path, ci: str, source: str = SAMPLE) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(source)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(TESTS)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "ci_skips", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_outside_ci_a_missing_prerequisite_skips(tmp_path):
    proc = run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 3 skipped, 1 xfailed" in proc.stdout, proc.stdout


def test_under_ci_a_missing_prerequisite_fails_with_its_install_command(tmp_path):
    proc = run(tmp_path, "true")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed, 2 skipped, 1 xfailed" in proc.stdout, proc.stdout
    assert "FAILED" in proc.stdout and "test_missing_tool" in proc.stdout and "host-packages.sh" in proc.stdout


def test_under_ci_a_module_skipped_at_collection_fails(tmp_path):
    outside = run(tmp_path, "", MODULE_SKIP)
    assert outside.returncode == 5 and "1 skipped" in outside.stdout, outside.stdout  # 5: no test ran
    proc = run(tmp_path, "true", MODULE_SKIP)
    assert proc.returncode == 2 and "1 error" in proc.stdout and "no_such_module_here" in proc.stdout, proc.stdout
