"""Deployments sharing one Redis never share limiter state by accident: every key ratejobs
writes carries the deployment's namespace (RATEJOBS_NAMESPACE, by default a hash of its
database), and the same namespace set on two deployments shares it on purpose."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from ratejobs.infra.clock import database_now
from ratejobs.infra.limiters import api_limiter
from ratejobs.infra.wakeups import schedule_wakeup
from ratejobs.limiter.deployment import check_namespace, namespace_for_database
from ratejobs.selectors.apis import api_key_buckets, api_rate_history
from ratejobs.services.apis import api_limiter_reset
from tests.conftest import _forget_redis_clients

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("services_redis")
PG = {"ENGINE": "django.db.backends.postgresql", "HOST": "db", "PORT": 5432, "NAME": "ratejobs"}


@pytest.fixture
def namespaces(settings, redis_client, unique_name) -> Iterator[Callable]:
    """use(suffix, limiters=""): switch this process to the namespace `<test name>-<suffix>`
    (and its limiters to `<test name>-<limiters>` when given); every key under the namespaces
    used is deleted afterwards."""
    default = settings.RATEJOBS_NAMESPACE
    used: list[str] = []

    def use(suffix: str, limiters: str = "") -> str:
        namespace = settings.RATEJOBS_NAMESPACE = f"{unique_name}-{suffix}"
        settings.RATEJOBS_LIMITER_NAMESPACE = f"{unique_name}-{limiters}" if limiters else ""
        used.extend([namespace, settings.RATEJOBS_LIMITER_NAMESPACE or namespace])
        return namespace

    yield use
    # the test's APIs were configured under the default namespace when they were made
    patterns = [f"ratejobs:{default}:limiter:{{{unique_name}*"]
    patterns += [f"ratejobs:{namespace}:*" for namespace in used]
    for pattern in patterns:
        keys = list(redis_client.scan_iter(match=pattern))
        if keys:
            redis_client.delete(*keys)
    _forget_redis_clients()


def limiter_status_text() -> str:
    out = io.StringIO()
    call_command("limiter_status", stdout=out)
    return out.getvalue()


def test_two_namespaces_on_one_redis_never_see_each_others_grants(api, namespaces):
    # given the deployment "a" granting 3 calls of the API and 1 of a customer's key
    namespace_a = namespaces("a")
    for _ in range(3):
        api_limiter(api).acquire(max_wait=1)
    api_limiter(api, "acme").acquire(max_wait=1)
    # expect: a deployment "b" with an API of the same name on the same Redis sees none of it
    namespaces("b")
    assert api_limiter(api).state().counts.grants == 0
    assert api_key_buckets(api).live == 0
    assert api_limiter_reset(api=api) == 0  # and its reset leaves "a" alone
    api_limiter(api).acquire(max_wait=1)
    # while "a" still sees exactly its own, and limiter_status says whose they are
    assert namespaces("a") == namespace_a
    assert api_limiter(api).state().counts.grants == 3
    assert api_key_buckets(api).live == 1
    assert f"(namespace {namespace_a})" in limiter_status_text().splitlines()[0]


def test_a_limiter_namespace_shares_the_limiters_alone(
    api, namespaces, redis_client, client, unique_name
):
    # given two deployments (two databases) sharing their limiters on purpose
    quota = f"{unique_name}-quota"
    namespace_a = namespaces("a", limiters="quota")
    for _ in range(2):
        api_limiter(api).acquire(max_wait=1)
    schedule_wakeup(api.pk, database_now() + timedelta(seconds=30))
    namespace_b = namespaces("b", limiters="quota")
    # expect: b's limiter is a's, and both say so
    assert api_limiter(api).state().counts.grants == 2
    assert f"(namespace {quota})" in limiter_status_text().splitlines()[0]
    body = client.get("/healthz").json()
    assert (body["namespace"], body["limiter_namespace"]) == (namespace_b, quota)
    # but a's dispatch keys, which name rows of a's database, are not b's
    wakeup = f"dispatch:{{{api.name}}}:wakeup"  # under the hash tag of the API's limiter
    assert redis_client.exists(f"ratejobs:{namespace_a}:{wakeup}")
    assert not redis_client.exists(f"ratejobs:{namespace_b}:{wakeup}")


def test_the_rate_history_is_read_under_the_namespace(api, namespaces, redis_down_later):
    since = timezone.now() - timedelta(minutes=1)
    namespaces("a")
    api_limiter(api).acquire(max_wait=1)
    (sample,) = api_rate_history(api, since=since)
    assert sample.rate_per_second == api.rate and sample.grants == 1
    assert api_rate_history(api, since=timezone.now() + timedelta(seconds=1)) == []
    # a customer's bucket keeps none (thousands of them would hold 1.5 MB each)
    api_limiter(api, "acme").acquire(max_wait=1)
    assert api_limiter(api, "acme").rate_history() == []
    namespaces("b")
    assert api_rate_history(api, since=since) == []
    # and with Redis down the chart has no history rather than an error
    redis_down_later()
    assert api_rate_history(api, since=since) == []


@pytest.fixture
def redis_down_later(settings) -> Callable[[], None]:
    """Call it to point the services at a port nobody listens on (the settings fixture puts the
    real URL back)."""
    from devtools import devredis

    def down() -> None:
        settings.REDIS_URL = f"redis://127.0.0.1:{devredis.free_port()}/0"
        _forget_redis_clients()

    return down


def test_dispatch_requests_are_kept_under_the_namespace(api, namespaces, redis_client):
    namespace = namespaces("a")
    # a wake-up 5 s away (request_dispatch's key lives 250 ms: too short to look at here)
    schedule_wakeup(api.pk, database_now() + timedelta(seconds=30))
    assert redis_client.exists(f"ratejobs:{namespace}:dispatch:{{{api.name}}}:wakeup")
    assert not redis_client.exists(f"ratejobs:dispatch:{{{api.name}}}:wakeup")


def test_the_default_namespace_is_a_short_stable_hash_of_the_database(tmp_path, monkeypatch):
    assert namespace_for_database(PG) == namespace_for_database(dict(PG))
    assert len(namespace_for_database(PG)) == 10
    for change in ({"NAME": "other"}, {"HOST": "db2"}, {"PORT": 5433}):
        assert namespace_for_database({**PG, **change}) != namespace_for_database(PG)
    # a SQLite file is known by its absolute path, however the URL spelt it
    monkeypatch.chdir(tmp_path)
    sqlite = {"ENGINE": "django.db.backends.sqlite3"}
    relative = namespace_for_database({**sqlite, "NAME": "db.sqlite3"})
    assert relative == namespace_for_database({**sqlite, "NAME": str(tmp_path / "db.sqlite3")})
    assert check_namespace(relative) == relative
    for bad in ("", "a:b", "a*", "{a}", "x" * 65):
        with pytest.raises(ValueError, match="RATEJOBS_NAMESPACE"):
            check_namespace(bad)


# Run in a clean interpreter: the settings module reads the environment once, at import.
SETTINGS_PROBE = """
import json
from django.conf import settings
from project.celery import app
from ratejobs.namespace import limiter_key_prefix
print(json.dumps({
    "namespace": settings.RATEJOBS_NAMESPACE,
    "broker": app.conf.broker_transport_options["global_keyprefix"],
    "cache": settings.CACHES["default"]["KEY_PREFIX"],
    "limiters": limiter_key_prefix(),
}))
"""


def test_the_namespaces_set_name_the_broker_the_cache_and_the_limiters():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings.base"}
    env |= {"RATEJOBS_NAMESPACE": "site-1", "RATEJOBS_LIMITER_NAMESPACE": "quota-1"}
    env |= {"DATABASE_URL": "sqlite:////tmp/elsewhere.db"}
    result = subprocess.run(
        [sys.executable, "-c", SETTINGS_PROBE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "namespace": "site-1",
        "broker": "ratejobs:site-1:broker:",
        "cache": "ratejobs:site-1:cache",
        "limiters": "ratejobs:quota-1:limiter",
    }
