"""`manage.py limiter_status`: the live limiter state of each API, as text or JSON; a clear
error and exit status 1 when Redis is down."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command

from ratejobs.infra.limiters import api_limiter
from ratejobs.limiter.deployment import deployment_key_prefix
from ratejobs.management.commands import limiter_status
from ratejobs.namespace import limiter_key_prefix
from ratejobs.services.apis import api_block

pytestmark = pytest.mark.usefixtures("services_redis")


def status(*args: str) -> str:
    out = io.StringIO()
    call_command("limiter_status", *args, stdout=out)
    return out.getvalue()


def test_a_table_of_every_api_and_json_for_one(api, make_api):
    other = make_api(rate=5, period=60, max_concurrency=3, adaptive=True, min_rate=1)
    with api_limiter(api).slot(max_wait=1):
        pass
    api_block(api=api, seconds=30)
    lines = status().splitlines()
    assert re.split(r"\s{2,}", lines[0])[:3] == ["API", "RATE NOW", "CEILING"]
    row = next(line for line in lines if line.startswith(api.name + " "))
    assert row.split()[1:5] == ["10/1s", "10/1s", "1", "no"]
    assert "s" in row.split()[5] and row.split()[5] != "no"  # blocked for ~30 s
    other_row = next(line for line in lines if line.startswith(other.name))
    assert other_row.split()[1:5] == ["5/60s", "5/60s", "1", "min"]
    assert "0/3" in other_row
    (state,) = json.loads(status(api.name, "--json"))
    assert (state["name"], state["rate"], state["counts"]["grants"]) == (api.name, 10.0, 1)
    assert 25 < state["blocked_for"] <= 30
    assert "credential" not in json.dumps(state)


def test_no_apis_is_said_in_words_and_an_empty_list_in_json():
    assert "no APIs yet" in status()
    assert "export RATEJOBS_LIMITER_NAMESPACE=" in status()
    assert json.loads(status("--json")) == []


def test_the_line_a_program_elsewhere_exports_names_the_same_buckets(api):
    # given the table, whose last line says what a program of one's own exports
    last = status().splitlines()[-1]
    assert last.startswith("programs elsewhere share these buckets with: export ")
    # expect: a program with only that variable finds the workers' keys
    assignment = last.split("export ", 1)[1].split()[0]
    variable, value = assignment.split("=", 1)
    assert deployment_key_prefix({variable: value}) == limiter_key_prefix()


def test_an_unknown_name_and_a_dead_redis_are_clear_errors(api, redis_down):
    with pytest.raises(CommandError, match="no API named 'nope'"):
        status("nope")
    with pytest.raises(CommandError, match="Redis cannot be reached") as raised:
        status()
    assert raised.value.returncode == 1


def test_limits_older_than_the_database_s_are_named_as_such(api):
    # given a change of limits the limiter has not seen yet (Redis was down when it was made)
    type(api).objects.filter(pk=api.pk).update(limits_version=2)
    # expect: the operator is told, and the JSON carries both versions' evidence
    row = next(line for line in status().splitlines() if line.startswith(api.name + " "))
    assert "older limits in Redis (version 1, the database's is 2)" in row
    assert json.loads(status(api.name, "--json"))[0]["config_version"] == 1


def test_every_column_has_a_header_in_words_and_a_line_of_the_legend(api, make_api):
    make_api(rate=5, period=60, max_concurrency=3, adaptive=True, min_rate=1)
    lines = status().splitlines()
    header = lines[0]
    for words in ("BLOCKED FOR", "NEXT SLOT IN", "IN FLIGHT/CAP", "GENERATION", "LEARNED LIMIT"):
        assert words in header
    assert "GEN " not in header
    # expect: under the table, one line for each column but the API's name, with its unit
    start = lines.index("columns (--no-legend leaves this out):")
    legend = lines[start + 1 : start + len(limiter_status.COLUMNS)]
    meaning = {re.split(r"\s{2,}", line.strip())[0]: line for line in legend}
    assert list(meaning) == list(limiter_status.COLUMNS[1:])
    assert "requests per period" in meaning["RATE NOW"] and "10.92/1s" in meaning["RATE NOW"]
    assert "seconds" in meaning["BLOCKED FOR"] and "seconds" in meaning["NEXT SLOT IN"]
    assert '"0/-": no cap' in meaning["IN FLIGHT/CAP"]
    # and --no-legend leaves it out, the table and the export line staying
    short = status("--no-legend").splitlines()
    assert not any(line.startswith("columns") for line in short)
    assert short[0] == header
    assert short[-1].startswith("programs elsewhere share these buckets with: ")
