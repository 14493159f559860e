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
