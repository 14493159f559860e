"""ratejobs' settings as the app gives them (ratejobs/conf.py): every default, the derived
ones, the checks, and what the environment and a project's settings change; and the system
checks a project that installs the app gets."""

from __future__ import annotations

import environ
import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from ratejobs import conf

SQLITE = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/app/db.sqlite3"}}


def test_a_project_that_sets_nothing_gets_every_setting_with_its_default():
    resolved = conf.resolve({"DATABASES": SQLITE})
    assert set(resolved) == set(conf.NAMES)
    assert resolved["RATEJOBS_CALLS_IN_FLIGHT"] == 64
    assert resolved["REDIS_URL"] == conf.DEFAULT_REDIS_URL
    assert resolved["RATEJOBS_CACHE_URL"] == conf.DEFAULT_REDIS_URL
    # derived: the database's hash, and the callbacks' deadline from their backoff (3,290 s)
    assert resolved["RATEJOBS_NAMESPACE"] == conf.namespace_for_database(SQLITE["default"])
    assert resolved["RATEJOBS_CALLBACK_DEADLINE_SECONDS"] == 3290


def test_derived_defaults_follow_what_the_project_set():
    resolved = conf.resolve({
        "DATABASES": SQLITE,
        "CELERY_BROKER_URL": "redis://broker.internal:6379/2",
        "RATEJOBS_CALLBACK_MAX_ATTEMPTS": 1,
    })  # fmt: skip
    assert resolved["REDIS_URL"] == "redis://broker.internal:6379/2"
    assert resolved["RATEJOBS_CACHE_URL"] == "redis://broker.internal:6379/2"
    assert resolved["RATEJOBS_CALLBACK_DEADLINE_SECONDS"] == 70
    # a broker that is no Redis leaves the limiters on the default Redis
    amqp = conf.resolve({"DATABASES": SQLITE, "CELERY_BROKER_URL": "amqp://guest@mq//"})
    assert amqp["REDIS_URL"] == conf.DEFAULT_REDIS_URL


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"RATEJOBS_NAMESPACE": "a:b"}, "RATEJOBS_NAMESPACE"),
        ({"RATEJOBS_LIMITER_NAMESPACE": "x*"}, "RATEJOBS_NAMESPACE"),
        ({"RATEJOBS_OUTBOUND_ALLOW": ["not a network/99"]}, "RATEJOBS_OUTBOUND_ALLOW"),
        ({"RATEJOBS_CALLBACK_ALLOW": [42]}, "RATEJOBS_CALLBACK_ALLOW"),
        ({"RATEJOBS_LOGIN_LOCKOUT_SECONDS": 0}, "RATEJOBS_LOGIN_LOCKOUT_SECONDS"),
        # make scale's redis-cluster row: every throttle's count was a MOVED error
        ({"REDIS_CLUSTER": True, "REDIS_URL": "redis://node1:7000/0"}, "RATEJOBS_CACHE_URL"),
    ],
)
def test_a_setting_that_cannot_work_stops_the_process_naming_it(given, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        conf.resolve({"DATABASES": SQLITE, **given})


def test_the_environment_gives_each_setting_cast_as_its_default():
    env = environ.Env()
    env.ENVIRON = {
        "RATEJOBS_CALLS_IN_FLIGHT": "8",
        "RATEJOBS_MAX_WORKER_WAIT": "2.5",
        "REDIS_CLUSTER": "true",
        "RATEJOBS_OUTBOUND_ALLOW": "10.0.0.0/8,*.corp.internal",
        "RATEJOBS_NAMESPACE": "",  # empty: the derived default still applies
        "RATEJOBS_FLOWER_URL": "",  # empty is a value for a plain default
        "DJANGO_DEBUG": "true",  # not ratejobs'
    }
    found = conf.from_environment(env)
    assert found == {
        "RATEJOBS_CALLS_IN_FLIGHT": 8,
        "RATEJOBS_MAX_WORKER_WAIT": 2.5,
        "REDIS_CLUSTER": True,
        "RATEJOBS_OUTBOUND_ALLOW": ["10.0.0.0/8", "*.corp.internal"],
        "RATEJOBS_FLOWER_URL": "",
    }


def test_the_running_settings_hold_every_ratejobs_setting(settings):
    for name in conf.NAMES:
        assert hasattr(settings, name), name


def _ratejobs_problems() -> list[str]:
    return [problem.id for problem in run_checks() if problem.id.startswith("ratejobs.")]


def test_the_project_passes_the_apps_checks():
    assert _ratejobs_problems() == []


def test_a_project_without_the_body_limit_or_the_throttled_backend_is_warned(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RequestSize" not in m]
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
    assert _ratejobs_problems() == ["ratejobs.W001", "ratejobs.W002"]


def test_a_project_missing_an_app_ratejobs_runs_on_is_told_which(settings):
    apps = [app for app in settings.INSTALLED_APPS if app != "drf_spectacular_sidecar"]
    with override_settings(INSTALLED_APPS=apps):
        problems = [p for p in run_checks() if p.id == "ratejobs.E001"]
    assert [p.msg for p in problems] == ["ratejobs needs drf_spectacular_sidecar in INSTALLED_APPS"]


def test_a_cluster_with_its_own_cache_is_accepted():
    resolved = conf.resolve(
        {
            "DATABASES": SQLITE,
            "REDIS_CLUSTER": True,
            "REDIS_URL": "redis://node1:7000/0",
            "RATEJOBS_CACHE_URL": "redis://cache:6379/1",
        }
    )
    assert resolved["RATEJOBS_CACHE_URL"] == "redis://cache:6379/1"
