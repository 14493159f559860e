"""Virtualenvs holding ratejobs as pip installs it from this checkout, with only the extras a
test names: what a user of the package gets, not what the project's own virtualenv has."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What pip needs to build the package: its metadata, its README and the package itself.
SOURCES = ("pyproject.toml", "README.md", "ratejobs")
PIP_TIMEOUT = 600


def _copy_sources(into: Path) -> Path:
    """The package's sources, copied: setuptools builds in the source tree (build/, egg-info),
    and two tests may build at once."""
    into.mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, into / name)
    return into


@pytest.fixture
def installed_venv(tmp_path: Path) -> Callable[..., Path]:
    """`make(extra, *more)`: a new virtualenv with `pip install "<checkout>[extra]" *more`;
    returns its bin directory."""

    def make(extra: str, *more: str) -> Path:
        source = _copy_sources(tmp_path / "source")
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        installed = subprocess.run(
            [*pip, "install", "-q", f"{source}[{extra}]", *more],
            capture_output=True, text=True, timeout=PIP_TIMEOUT,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stdout + installed.stderr
        return venv / "bin"

    return make


def installed_names(bin_dir: Path) -> set[str]:
    """The distributions in the virtualenv, by their normalised names."""
    listed = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return {line.split("==")[0].lower().replace("_", "-") for line in listed.stdout.split()}
