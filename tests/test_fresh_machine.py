"""`make test` on a fresh machine: nothing answers at REDIS_URL, so the run starts a private
Redis before Django reads its settings (tests/before_settings.py), and every setting that names
a Redis follows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import devredis

ROOT = Path(__file__).resolve().parent.parent

# Run by a pytest of its own, with the project's options (pyproject.toml) and without the
# tests' conftest: what it sees is what every test of a fresh machine sees.
INNER_TEST = """
import os

import redis
from django.conf import settings
from django.core.cache import cache

from project.celery import app


def test_every_redis_setting_follows_the_private_redis():
    url = os.environ["REDIS_URL"]
    assert url not in (DEAD, OTHER_DEAD)
    assert settings.REDIS_URL == url
    assert settings.CELERY_BROKER_URL == url
    assert app.conf.broker_url == url
    assert settings.RATEJOBS_CACHE_URL == url
    assert settings.CACHES["default"]["LOCATION"] == url
    assert os.environ["CELERY_RESULT_BACKEND"] == "memory://"
    cache.set("fresh-machine", "kept", 30)
    assert cache.get("fresh-machine") == "kept"
    assert redis.Redis.from_url(url).ping()
    print("PRIVATE", url)
"""


@pytest.mark.slow
def test_make_test_starts_a_private_redis_that_every_setting_follows(tmp_path):
    dead = f"redis://127.0.0.1:{devredis.free_port()}/0"
    other_dead = f"redis://127.0.0.1:{devredis.free_port()}/1"
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(f"DEAD = {dead!r}\nOTHER_DEAD = {other_dead!r}\n{INNER_TEST}")
    env = {
        **os.environ,
        "REDIS_URL": dead,
        "CELERY_BROKER_URL": other_dead,  # another dead one: it follows too
        "CELERY_RESULT_BACKEND": "memory://",  # not a Redis: left alone
    }
    env.pop("RATEJOBS_CACHE_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q",
         "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(test_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (url,) = [line.split()[1] for line in result.stdout.splitlines() if "PRIVATE" in line]
    # and the private server ends with the run
    assert not devredis.answers(url)


def test_a_redis_that_answers_is_used_as_it_is(redis_url):
    environ = {"REDIS_URL": redis_url, "CELERY_BROKER_URL": "memory://"}
    server = devredis.ensure_for_environment(environ)
    assert not server.started_here
    assert environ == {"REDIS_URL": redis_url, "CELERY_BROKER_URL": "memory://"}


@pytest.mark.parametrize("name", devredis.REDIS_URL_VARIABLES[1:])
def test_a_dead_redis_variable_follows_the_found_one(redis_url, name):
    dead = f"redis://127.0.0.1:{devredis.free_port()}/0"
    environ = {"REDIS_URL": redis_url, name: dead}
    devredis.ensure_for_environment(environ)
    assert environ == {"REDIS_URL": redis_url, name: redis_url}
