"""CI cannot go green by skipping: with CI=true a test that would skip fails, with its reason,
whether the test skips as it runs or its module skips as it is imported (tests/every_test_runs.py);
without CI both stay skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.processes import ci_requires_every_check

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("ci", ["true", ""])
def test_the_browser_test_without_chromium_fails_under_ci_and_skips_elsewhere(ci: str) -> None:
    # given a PATH with Python's tools and no Chromium
    env = {**os.environ, "CI": ci, "PATH": str(Path(sys.executable).parent)}
    # when one browser test runs
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "read_only",
         "tests/browser/test_admin_in_browser.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    # expect: a failure that says why under CI (at setup, so pytest counts an error), a skip
    # elsewhere
    if ci:
        assert result.returncode != 0, result.stdout[-2000:]
        assert "skipped with CI=true, where every test must run" in result.stdout
        assert "no Chromium on PATH" in result.stdout
    else:
        assert result.returncode == 0, result.stdout[-2000:]
        assert "1 skipped" in result.stdout


SKIPS_AT_IMPORT = """
import pytest

pytest.importorskip("a_module_no_machine_has")


def test_never_collected():
    pass
"""
SKIPS_AS_IT_RUNS = """
import pytest


def test_skips():
    pytest.skip("no such thing here")
"""


def run_inner_pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_import_skip.py").write_text(SKIPS_AT_IMPORT)
    (tmp_path / "test_run_skip.py").write_text(SKIPS_AS_IT_RUNS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's options
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider",
         "-p", "tests.every_test_runs", "-c", str(tmp_path / "pytest.ini"), "-rA", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("ci", ["true", "YES"])
def test_with_ci_a_skip_at_import_or_at_run_fails(tmp_path, ci):
    result = run_inner_pytest(tmp_path, ci)
    assert result.returncode != 0
    out = result.stdout
    assert "test_import_skip.py" in out and "a_module_no_machine_has" in out
    assert "skipped with CI=true, where every test must run" in out
    assert "FAILED" in out and "test_skips" in out


@pytest.mark.slow
@pytest.mark.parametrize("ci", [None, "false"])
def test_without_ci_skips_stay_skips(tmp_path, ci):
    result = run_inner_pytest(tmp_path, ci)
    assert result.returncode == 0, result.stdout
    assert "2 skipped" in result.stdout


def test_ci_is_read_one_way_everywhere():
    assert ci_requires_every_check({"CI": " True "})
    assert not ci_requires_every_check({"CI": "no"})
    assert not ci_requires_every_check({})
