"""Settings for the test suite: DATABASE_URL when set (PostgreSQL in CI), SQLite otherwise."""

from __future__ import annotations

from .base import *  # noqa: F403

DEBUG = False
# Celery worker processes started by the tests open the test database by name, so SQLite's
# test database is a file, not the default in-memory one.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "test-db.sqlite3")}  # noqa: F405
# Hashing passwords properly is slow and tests don't need it.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# The tests, the sandbox and the workers the tests start all talk over loopback (and only
# there): allowed unless the environment says otherwise.
RATEJOBS_OUTBOUND_ALLOW = env.list(  # noqa: F405
    "RATEJOBS_OUTBOUND_ALLOW", default=["127.0.0.1/32", "::1/128"]
)
# Callbacks too (the workers the tests start read this module, not a test's settings fixture);
# tests/security/test_callback_policy.py checks the default, empty, list refuses loopback.
RATEJOBS_CALLBACK_ALLOW = env.list(  # noqa: F405
    "RATEJOBS_CALLBACK_ALLOW", default=["127.0.0.1/32", "::1/128"]
)
# A worker killed by a test is found dead in seconds, not half a minute (the environment may
# still say otherwise).
RATEJOBS_WORKER_HEARTBEAT_SECONDS = env.float(  # noqa: F405
    "RATEJOBS_WORKER_HEARTBEAT_SECONDS", default=2.0
)
RATEJOBS_WORKER_DEAD_AFTER = env.float("RATEJOBS_WORKER_DEAD_AFTER", default=10.0)  # noqa: F405
