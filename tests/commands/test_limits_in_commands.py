"""Several limits and call cost on the command line and in the metrics: `limiter_status` prints
each window, `submit_job` reads each call's cost from its file, /metrics has a gauge per window."""

from __future__ import annotations

import json
import re

import pytest
from django.core.management import CommandError

from ratejobs.models import Call
from ratejobs.services.apis import api_limiter
from tests.commands.test_limiter_status import status
from tests.commands.test_submit_job import root, submit  # noqa: F401 (fixture)
from tests.test_metrics import scrape

pytestmark = pytest.mark.usefixtures("services_redis")

LIMITS = [
    {"rate": 10, "period": 60, "burst": 10},  # one back every 6 s: the counts stay exact
    {"rate": 9000, "period": 86400, "burst": 9000, "unit": "cost"},
]


@pytest.fixture
def limited(make_api):
    """An API with a per-minute window and a daily token quota, 3 calls of 1,000 tokens in."""
    api = make_api(limits=LIMITS)
    limiter = api_limiter(api)
    for _ in range(3):
        limiter.release(limiter.acquire(cost=1000, max_wait=5))
    return api


def test_limiter_status_prints_each_window_under_its_api_and_in_json(limited):
    lines = status().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(limited.name + " "))
    assert lines[row + 1].startswith("  limit 10/60s: 10 per 60 s (burst 10): 7 left, full in 1")
    assert lines[row + 2].startswith(
        "  limit 9000 cost/86400s: 9000 cost per 86400 s (burst 9000): 6000 left, full in"
    )
    # the day's quota says when it is whole again as a time of day too
    assert re.search(r"full in (8 h 00|7 h 59) min \(at \d\d:\d\d UTC\)$", lines[row + 2])
    (state,) = json.loads(status(limited.name, "--json"))
    windows = state["windows"]
    assert [w["label"] for w in windows] == ["10/60s", "9000 cost/86400s"]
    assert windows[1]["window"] == {"rate": 9000.0, "period": 86400.0, "burst": 9000,
                                    "unit": "cost"}  # fmt: skip
    assert 6000 <= windows[1]["remaining"] < 6001
    assert 28_700 < windows[1]["full_in"] <= 28_800  # 3,000 tokens back at 9,000 a day


def test_metrics_export_each_window_with_its_label(client, settings, limited):
    settings.RATEJOBS_METRICS_PUBLIC = True
    samples = scrape(client)

    def sample(name: str, window: str) -> float:
        return samples[(name, (("api", limited.name), ("window", window)))]

    assert 7 <= sample("ratejobs_limiter_window_remaining", "10/60s") < 7.5
    assert sample("ratejobs_limiter_window_burst", "10/60s") == 10
    assert 6000 <= sample("ratejobs_limiter_window_remaining", "9000 cost/86400s") < 6001
    assert 28_700 < sample("ratejobs_limiter_window_full_seconds", "9000 cost/86400s") <= 28_800


def test_submit_job_reads_each_call_s_cost_from_a_csv_or_jsonl_file(limited, root, tmp_path):  # noqa: F811
    csv_file = tmp_path / "calls.csv"
    csv_file.write_text("path,cost\n/a,120\n/b,\n/c,9000\n")
    submit("--api", limited.name, "--file", str(csv_file), "--name", "costs")
    costs = Call.objects.filter(job__name="costs").order_by("index").values_list("cost", flat=True)
    assert list(costs) == [120, 0, 9000]

    jsonl = tmp_path / "calls.jsonl"
    jsonl.write_text('{"path": "/a", "cost": 5}\n{"path": "/b", "cost": 9001}\n')
    with pytest.raises(CommandError, match="line 2: cost: must be a whole number from 0 to 9,000"):
        submit("--api", limited.name, "--file", str(jsonl), "--name", "too dear")
    assert not Call.objects.filter(job__name="too dear").exists()


def test_a_csv_cost_that_is_not_a_whole_number_is_named(limited, root, tmp_path):  # noqa: F811
    csv_file = tmp_path / "calls.csv"
    csv_file.write_text("path,cost\n/a,1.5\n")
    with pytest.raises(CommandError, match="line 2: cost: must be a whole number"):
        submit("--api", limited.name, "--file", str(csv_file))
