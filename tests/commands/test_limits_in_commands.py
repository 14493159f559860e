"""Several limits and call cost on the command line and in the metrics: `limiter_status` prints
each window, `submit_job` reads each call's cost from its file, /metrics has a gauge per window."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Call
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


def api_limits(*args: str) -> str:
    out = io.StringIO()
    call_command("api_limits", *args, stdout=out)
    return out.getvalue()


def test_api_limits_sets_the_windows_and_the_limiter_takes_them(
    make_api, django_capture_on_commit_callbacks
):
    api = make_api()
    with django_capture_on_commit_callbacks(execute=True):
        out = api_limits(
            api.name, "--rate", "20", "--limit", "300/60/30", "--limit", "90000/60:cost"
        )
    api.refresh_from_db()
    # expect: stored as the REST API and the admin store them, a new version, and in Redis
    assert api.rate == 20
    assert api.limits == [
        {"rate": 300.0, "period": 60.0, "burst": 30, "unit": "requests"},
        {"rate": 90000.0, "period": 60.0, "burst": 1, "unit": "cost"},
    ]
    assert "limits changed (version 2)" in out
    assert "and 90000 cost per 60 s (burst 1)" in out
    assert [w.window.label for w in api_limiter(api).state().windows] == [
        "300/60s",
        "90000 cost/60s",
    ]
    # and --no-limits takes the windows away; no option only shows them
    api_limits(api.name, "--no-limits")
    api.refresh_from_db()
    assert api.limits == []
    assert api_limits(api.name) == f"{api.name}: 20 per 1 s (burst 1)\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "300"], "give RATE/PERIOD"),
        (["--limit", "300/60:tokens"], "give RATE/PERIOD"),
        (["--limit", "300/0"], "limits[0].period"),
        (["--burst", "0"], "burst"),
    ],
)
def test_api_limits_refuses_bad_limits_and_changes_nothing(make_api, args, message):
    api = make_api()
    with pytest.raises(CommandError, match=re.escape(message)):
        api_limits(api.name, *args)
    api.refresh_from_db()
    assert (api.limits, api.limits_version) == ([], 1)
    with pytest.raises(CommandError, match="no API named"):
        api_limits("missing", "--rate", "1")
