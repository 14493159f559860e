"""Settings shared by every environment, read from the environment with django-environ.

The defaults suit a development checkout; production.py removes the ones that must not leak.
"""

from __future__ import annotations

from pathlib import Path

import environ
from kombu import Queue

from ratejobs import conf
from ratejobs.celery_settings import (
    RATEJOBS_TASK_QUEUES,
    RATEJOBS_TASK_ROUTES,
    RATEJOBS_WORKER_CONSUMER,
    broker_key_prefix,
    ratejobs_beat_schedule,
)
from ratejobs.limiter.deployment import default_database_url
from ratejobs.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="django-insecure-development-key-do-not-deploy")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    # The admin as the ratejobs console (its name, the overview as home, the sidebar's order);
    # a host project keeps "django.contrib.admin" and its own admin (docs/install.md).
    "ratejobs.console.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "ratejobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Project-wide overrides of the admin's own templates (the header's links).
        "DIRS": [BASE_DIR / "project" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "ratejobs.context_processors.operations_links",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=default_database_url())}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Workers and the web server write at once: WAL lets readers go on during a write, and
    # IMMEDIATE transactions queue writers on the busy timeout instead of failing to upgrade a
    # read lock ("database is locked").
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=30,
        transaction_mode="IMMEDIATE",
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    )
# Connections are kept between requests and tasks and checked before reuse.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DJANGO_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# Every ratejobs setting (RATEJOBS_*, and REDIS_* for the limiters' Redis): from the variable of
# the same name when set, else its default (ratejobs/conf.py; docs/configuration.md says what
# each does). The app itself fills in the same defaults in a project that sets none.
_ratejobs = conf.resolve({"DATABASES": DATABASES, **conf.from_environment(env)})
globals().update(_ratejobs)
REDIS_URL = _ratejobs["REDIS_URL"]
RATEJOBS_NAMESPACE = _ratejobs["RATEJOBS_NAMESPACE"]
REDIS_SENTINEL_MASTER = _ratejobs["REDIS_SENTINEL_MASTER"]

CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = TIME_ZONE
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
# Results live in the database (Call rows); Celery's result backend would only duplicate them.
CELERY_TASK_IGNORE_RESULT = True
# A task is acknowledged only after it ran, and given back if its worker dies, so a crash
# loses no call; tasks must therefore be safe to run twice.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# With acks_late a lost broker connection redelivers the running tasks anyway; cancel them
# rather than let a second copy run beside them.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# Workers take one task at a time: a prefetched task would wait behind a rate-limited one.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SEND_SENT_EVENT = True
CELERY_WORKER_SEND_TASK_EVENTS = True
# A task claims its calls and hands them to the process's threads; minutes means it is stuck.
CELERY_TASK_SOFT_TIME_LIMIT = 5 * 60
CELERY_TASK_TIME_LIMIT = CELERY_TASK_SOFT_TIME_LIMIT + 60
# ratejobs' control tasks have their own queue (ratejobs/celery_settings.py). A worker started
# with the plain `celery -A project worker` consumes every queue listed here.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [Queue("celery"), *RATEJOBS_TASK_QUEUES]
CELERY_TASK_ROUTES = {**RATEJOBS_TASK_ROUTES}
# Celery's consumer, except that losing the broker while tasks run cannot end the worker
# (ratejobs/celery_settings.py).
CELERY_WORKER_CONSUMER = RATEJOBS_WORKER_CONSUMER
# Celery's Django fixup closes the database connection around every task unless this is set;
# project/celery.py closes unusable and old connections around each task instead, as Django
# does per request (CONN_MAX_AGE, CONN_HEALTH_CHECKS).
CELERY_DB_REUSE_MAX = 1_000_000
# Redis hands an unacknowledged task to another worker after this long. It must exceed the
# hard time limit and the longest countdown we schedule (Retry-After), or tasks run twice.
# global_keyprefix: the broker's keys under the deployment's namespace (Flower reads the same
# option from this app's configuration).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 60 * 60,
    "global_keyprefix": broker_key_prefix(RATEJOBS_NAMESPACE),
}
if REDIS_SENTINEL_MASTER:  # with CELERY_BROKER_URL=sentinel://host:26379;sentinel://...
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = REDIS_SENTINEL_MASTER

# The reconciler is a safety net run by `celery -A project beat`, not the engine: workers alone
# run jobs to completion.
CELERY_BEAT_SCHEDULE = ratejobs_beat_schedule(
    reconcile_interval=_ratejobs["RATEJOBS_RECONCILE_INTERVAL"],
    retention_interval=_ratejobs["RATEJOBS_RETENTION_INTERVAL"],
)

# One INFO line per throttle decision (api, job and call ids); "json" for one JSON object per
# line. Celery workers use the same format (ratejobs.worker.signals).
LOGGING = logging_config(
    log_format=_ratejobs["RATEJOBS_LOG_FORMAT"], level=_ratejobs["RATEJOBS_LOG_LEVEL"]
)

# The REST API's views set their own authentication, parsers, pagination and schema
# (ratejobs/rest/views.py); these defaults are for any other DRF view of the project.
REST_FRAMEWORK = {
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# Every REST route refuses a body over its limit with 413 before reading it, chunked bodies
# included (ratejobs/rest/middleware.py). The REST API reads request bodies itself; Django's
# cap (admin forms) must never be the one that refuses an API request first.
DATA_UPLOAD_MAX_MEMORY_SIZE = _ratejobs["RATEJOBS_MAX_REQUEST_BYTES"]
MIDDLEWARE = ["ratejobs.rest.middleware.RequestSizeMiddleware", *MIDDLEWARE]

# The job-creation and sign-in throttles count in a cache every web process shares (a
# per-process cache would multiply their limits by the number of gunicorn workers).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": _ratejobs["RATEJOBS_CACHE_URL"],
        "KEY_PREFIX": f"ratejobs:{RATEJOBS_NAMESPACE}:cache",
        # A Redis that stops answering (rather than refusing) must not hang sign-ins and job
        # submissions: their throttles give up on the cache after this and go on uncounted.
        "OPTIONS": {
            "socket_connect_timeout": 1.0,
            "socket_timeout": 2.0,
            # With Sentinels, the cache on REDIS_URL follows the master they name.
            **(
                {"pool_class": "ratejobs.infra.connections.SentinelMasterPool"}
                if _ratejobs["REDIS_SENTINELS"]
                and _ratejobs["RATEJOBS_CACHE_URL"] == _ratejobs["REDIS_URL"]
                else {}
            ),
        },
    }
}

# Wrong passwords (the admin's sign-in page, any authenticate() call) are counted per username
# and per client address in the cache above (ratejobs/login_throttle.py).
AUTHENTICATION_BACKENDS = ["ratejobs.login_throttle.ThrottledModelBackend"]
