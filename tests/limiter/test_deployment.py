"""A program outside Django finds the deployment's limiters from the environment the deployment
reads (ratejobs.limiter.deployment): the namespace set, else the hash of the database in
DATABASE_URL, parsed as django-environ parses it for the settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import environ
import hypothesis.strategies as st
import pytest
import redis
from hypothesis import given, settings

from ratejobs.limiter import Limiter
from ratejobs.limiter.deployment import (
    NamespaceUnknown,
    database_identity,
    default_database_url,
    deployment_key_prefix,
    deployment_namespace,
    namespace_for_database,
)

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("ENGINE", "NAME", "HOST", "PORT")

_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12)
_hosts = st.one_of(
    _names,
    st.just("127.0.0.1"),
    st.just("[::1]"),
    st.just("DB.Example.ORG"),
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b.example", "[::1]", "10.0.0.2"]), st.integers(1, 65535)
        ).map(lambda hp: f"{hp[0]}:{hp[1]}"),
        min_size=2,
        max_size=3,
    ).map(",".join),
)


@st.composite
def database_urls(draw) -> str:
    scheme = draw(st.sampled_from(["postgres", "postgresql", "pgsql", "psql", "postgis"]))
    user = draw(st.one_of(st.just(""), _names.map(lambda u: f"{u}:{quote('p@ss/w', safe='')}@")))
    host = draw(st.one_of(st.just(""), _hosts))
    port = draw(st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}")))
    if "," in host:
        port = ""
    if draw(st.booleans()) and not host:
        path = "/" + quote("/var/run/postgresql", safe="") + "/" + draw(_names)
        return f"{scheme}://{user}{path}"
    query = draw(st.sampled_from(["", "?sslmode=require", "?conn_max_age=60&x=1"]))
    return f"{scheme}://{user}{host}{port}/{draw(_names)}{query}"


@settings(max_examples=300, deadline=None)
@given(url=st.one_of(database_urls(), _names.map(lambda n: f"sqlite:///{n}.db")))
def test_the_database_is_read_from_its_url_as_the_settings_read_it(url):
    theirs = environ.Env.db_url_config(url)
    ours = database_identity(url)
    assert {f: ours[f] for f in FIELDS} == {f: theirs.get(f, "") for f in FIELDS}
    assert namespace_for_database(ours) == namespace_for_database(theirs)


@pytest.mark.parametrize(
    "url",
    [
        "postgres://postgres@127.0.0.1:5432/test",
        "postgresql://u:p@db/ratejobs",
        "postgres:////var/run/postgresql/app",
        "postgres://%2Fvar%2Frun%2Fpostgresql/app",
        "postgres://u@h1:5432,h2:5433/app",
        "sqlite:////srv/ratejobs/db.sqlite3",
        "sqlite:///relative.db",
        "sqlite://",
        "sqlite://:memory:",
    ],
)
def test_known_urls_agree_with_django_environ(url):
    theirs = environ.Env.db_url_config(url)
    assert namespace_for_database(database_identity(url)) == namespace_for_database(theirs)


def test_the_namespace_set_comes_first_then_the_database():
    url = "postgres://postgres@127.0.0.1:5432/test"
    derived = namespace_for_database(environ.Env.db_url_config(url))
    assert deployment_namespace({"DATABASE_URL": url}) == derived
    assert deployment_namespace({"DATABASE_URL": url, "RATEJOBS_NAMESPACE": "site"}) == "site"
    both = {"DATABASE_URL": url, "RATEJOBS_NAMESPACE": "site", "RATEJOBS_LIMITER_NAMESPACE": "q"}
    assert deployment_namespace(both) == "q"
    assert deployment_key_prefix(both) == "ratejobs:q:limiter"
    # the standalone project's own SQLite file, when nothing is set in its checkout
    assert deployment_namespace({}) == namespace_for_database(
        environ.Env.db_url_config(default_database_url())
    )
    with pytest.raises(ValueError, match="RATEJOBS_NAMESPACE"):
        deployment_namespace({"RATEJOBS_NAMESPACE": "a:b"})
    with pytest.raises(ValueError, match="set RATEJOBS_NAMESPACE"):
        deployment_namespace({"DATABASE_URL": "mysql://db/app"})


def test_outside_a_checkout_an_empty_environment_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr("ratejobs.limiter.deployment.CHECKOUT_ROOT", tmp_path)
    with pytest.raises(NamespaceUnknown, match="limiter_status"):
        deployment_namespace({})


# Run in a clean interpreter: the settings read the environment once, at import.
PROBE = """
import json, os
from django.conf import settings
from ratejobs.namespace import limiter_key_prefix
from ratejobs.limiter.deployment import deployment_key_prefix
print(json.dumps([limiter_key_prefix(), deployment_key_prefix()]))
"""


@pytest.mark.parametrize(
    "environment",
    [
        {},
        {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/somewhere"},
        {"DATABASE_URL": "sqlite:///elsewhere.db"},
        {"DATABASE_URL": "sqlite:///elsewhere.db", "RATEJOBS_NAMESPACE": "site-2"},
        {"RATEJOBS_NAMESPACE": "site-2", "RATEJOBS_LIMITER_NAMESPACE": "quota-2"},
    ],
    ids=["nothing", "postgres", "sqlite", "namespace", "limiter-namespace"],
)
def test_a_program_and_the_settings_agree_on_the_limiters_keys(environment, tmp_path):
    names = ("DATABASE_URL", "RATEJOBS_NAMESPACE", "RATEJOBS_LIMITER_NAMESPACE")
    env = {k: v for k, v in os.environ.items() if k not in names}
    env |= {"DJANGO_SETTINGS_MODULE": "project.settings.base", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,  # a relative SQLite path is the same file for both
        env=env | environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    settings_prefix, program_prefix = json.loads(result.stdout)
    assert program_prefix == settings_prefix


def test_a_limiter_made_without_a_prefix_uses_the_deployments_buckets(
    monkeypatch, redis_client: redis.Redis, unique_name
):
    monkeypatch.setenv("RATEJOBS_LIMITER_NAMESPACE", unique_name)
    limiter = Limiter(redis_client, "edge")
    assert limiter.config_key == f"ratejobs:{unique_name}:limiter:{{edge}}:config"
    assert Limiter(redis_client, "edge", key_prefix="mine").config_key == "mine:{edge}:config"
