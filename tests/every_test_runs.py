"""pytest plugin (`-p tests.every_test_runs` in pyproject.toml): with CI set (CI=true, as on CI)
a test that would skip fails instead, with its reason, so CI cannot go green by skipping the
browser or the PostgreSQL tests. Without CI a skip stays a skip, so `make test` passes on a
machine without Chromium or PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from devtools.processes import ci_requires_every_check


def pytest_configure(config: pytest.Config) -> None:
    if ci_requires_every_check():
        # a module that fails to collect fails the run, and the other tests still run and
        # report, as they do beside a test that fails
        config.option.continue_on_collection_errors = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if ci_requires_every_check() and report.skipped and not hasattr(report, "wasxfail"):
        _fail_instead_of_skipping(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    # A module that skips as it is imported (pytest.importorskip at its top) skips all its tests
    # before any of them has a report: with CI set that is a collection error.
    report = yield
    if ci_requires_every_check() and report.skipped:
        _fail_instead_of_skipping(report)
    return report


def _fail_instead_of_skipping(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"skipped with CI=true, where every test must run: {reason}"
