"""Settings shared by every environment, read from the environment with django-environ.

The defaults suit a development checkout; production.py removes the ones that must not leak.
"""

from __future__ import annotations

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from ratejobs.execution.backoff import backoff_ceiling
from ratejobs.execution.outbound import OutboundPolicy
from ratejobs.limiter.deployment import (
    check_namespace,
    default_database_url,
    namespace_for_database,
)
from ratejobs.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="django-insecure-development-key-do-not-deploy")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
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

# The shared rate limiter state lives here; the broker defaults to the same server.
REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Every key this deployment writes in Redis (limiters, dispatch, locks, cache, the broker's
# queues) starts with ratejobs:<namespace>:. By default a hash of the database, so deployments
# with different databases on one Redis never share state by accident; set it when processes
# of one deployment reach the database by different addresses (a pooler), so they agree.
RATEJOBS_NAMESPACE = check_namespace(
    env.str("RATEJOBS_NAMESPACE", default="") or namespace_for_database(DATABASES["default"])
)
# The limiters alone under another namespace: the same value on two deployments with different
# databases shares their limiters (one quota) on purpose, while their broker queues, dispatch
# keys and cache, which name rows of each one's database, stay apart. Empty: RATEJOBS_NAMESPACE.
RATEJOBS_LIMITER_NAMESPACE = env.str("RATEJOBS_LIMITER_NAMESPACE", default="")
if RATEJOBS_LIMITER_NAMESPACE:
    check_namespace(RATEJOBS_LIMITER_NAMESPACE)
# High availability for the limiter's Redis (see README, "Several machines"): either Sentinel
# (REDIS_URL then gives the database number and password, its host is not used) or Cluster.
REDIS_SENTINELS = env.list("REDIS_SENTINELS", default=[])  # host:port of each sentinel
REDIS_SENTINEL_MASTER = env.str("REDIS_SENTINEL_MASTER", default="")
REDIS_CLUSTER = env.bool("REDIS_CLUSTER", default=False)

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
# Dispatch and reconcile tasks have their own queue: behind a window of call messages in the
# default queue they would wait seconds and the window would run dry. A worker started with
# the plain `celery -A project worker` consumes every queue listed here.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [Queue("celery"), Queue("ratejobs.control")]
CELERY_TASK_ROUTES = {
    "ratejobs.dispatch": {"queue": "ratejobs.control"},
    "ratejobs.reconcile": {"queue": "ratejobs.control"},
    "ratejobs.retention": {"queue": "ratejobs.control"},
    "ratejobs.purge_jobs": {"queue": "ratejobs.control"},
}
# Celery's Django fixup closes the database connection around every task unless this is set;
# project/celery.py closes unusable and old connections around each task instead, as Django
# does per request (CONN_MAX_AGE, CONN_HEALTH_CHECKS).
CELERY_DB_REUSE_MAX = 1_000_000
# Redis hands an unacknowledged task to another worker after this long. It must exceed the
# hard time limit and the longest countdown we schedule (Retry-After), or tasks run twice.
# global_keyprefix: the broker's queues, bindings and unacked messages live under the
# deployment's namespace too, so two deployments on one Redis never take each other's tasks
# (Flower reads the same option from this app's configuration).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 60 * 60,
    "global_keyprefix": f"ratejobs:{RATEJOBS_NAMESPACE}:broker:",
}
if REDIS_SENTINEL_MASTER:  # with CELERY_BROKER_URL=sentinel://host:26379;sentinel://...
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = REDIS_SENTINEL_MASTER

# --- ratejobs -----------------------------------------------------------------------------
# Fernet key for API credentials stored in the database; derived from SECRET_KEY when empty.
RATEJOBS_CREDENTIALS_KEY = env("RATEJOBS_CREDENTIALS_KEY", default="")
# An API's credential_env may name a variable starting with RATEJOBS_CRED_, or one listed here
# (names, comma-separated): never any other variable of the workers' environment.
RATEJOBS_CREDENTIAL_ENV_ALLOW = env.list("RATEJOBS_CREDENTIAL_ENV_ALLOW", default=[])
# Most calls one POST /api/jobs/ may carry, and the largest request body a call may have.
RATEJOBS_MAX_CALLS_PER_REQUEST = env.int("RATEJOBS_MAX_CALLS_PER_REQUEST", default=100_000)
RATEJOBS_MAX_CALL_BODY_BYTES = env.int("RATEJOBS_MAX_CALL_BODY_BYTES", default=1024 * 1024)
# Response bodies are stored up to this size, with a truncated flag beyond it.
RATEJOBS_MAX_RESPONSE_BYTES = env.int("RATEJOBS_MAX_RESPONSE_BYTES", default=1024 * 1024)
# Workers connect only to public addresses, plus these networks (CIDR), addresses and host
# names (comma-separated; "*.corp.internal" for every name under it): loopback, private and
# link-local addresses (cloud metadata) are refused at connect time unless listed here.
RATEJOBS_OUTBOUND_ALLOW = env.list("RATEJOBS_OUTBOUND_ALLOW", default=[])
# A bad entry stops every process as it starts, not a worker at its first call.
OutboundPolicy.from_allow_list(RATEJOBS_OUTBOUND_ALLOW)
# Job callbacks go to public addresses only, plus these (the same syntax); the list above does
# not apply to them: any user may set a callback_url, only managers configure APIs.
RATEJOBS_CALLBACK_ALLOW = env.list("RATEJOBS_CALLBACK_ALLOW", default=[])
OutboundPolicy.from_allow_list(RATEJOBS_CALLBACK_ALLOW, setting="RATEJOBS_CALLBACK_ALLOW")
# The broker holds at most this many seconds of an API's work (at its rate), so a job of a
# million calls never floods it; bounded below so every worker has something to take.
RATEJOBS_DISPATCH_WINDOW_SECONDS = env.float("RATEJOBS_DISPATCH_WINDOW_SECONDS", default=2.0)
RATEJOBS_DISPATCH_WINDOW_MIN = env.int("RATEJOBS_DISPATCH_WINDOW_MIN", default=16)
RATEJOBS_DISPATCH_WINDOW_MAX = env.int("RATEJOBS_DISPATCH_WINDOW_MAX", default=1000)
# A worker waits for a limiter slot this long at most; a longer wait puts the call back in the
# database with next_attempt_at, since a long countdown task in a Redis broker would run twice.
# A call whose job is paused or cancelled while it waits is sent at most this long afterwards,
# which keeps pause and cancel within a second.
RATEJOBS_MAX_WORKER_WAIT = env.float("RATEJOBS_MAX_WORKER_WAIT", default=1.0)
# Calls one worker process keeps in flight at once, on a pool of threads (a prefork process
# holds one task at a time; its calls run on these threads while it takes the next message).
# Enough for 64 calls/s per process at a 1 s response time; each thread costs about 100 KiB.
RATEJOBS_CALLS_IN_FLIGHT = env.int("RATEJOBS_CALLS_IN_FLIGHT", default=64)
# Calls per broker message at most (fewer for slow APIs: no more than one worker wait grants).
RATEJOBS_CALLS_PER_MESSAGE = env.int("RATEJOBS_CALLS_PER_MESSAGE", default=64)
# Every worker process writes a heartbeat this often; one not seen for RATEJOBS_WORKER_DEAD_AFTER
# seconds is dead, and the calls it claimed are taken back (by the workers themselves, or the
# reconciler). Above the longest pause a busy process may have (a database failover).
RATEJOBS_WORKER_HEARTBEAT_SECONDS = env.float("RATEJOBS_WORKER_HEARTBEAT_SECONDS", default=5.0)
RATEJOBS_WORKER_DEAD_AFTER = env.float("RATEJOBS_WORKER_DEAD_AFTER", default=30.0)
# /healthz answers 503 when no worker was seen in the last minute only with this set; by
# default that is "degraded" with 200, so a web container is not restarted for want of workers.
RATEJOBS_HEALTH_REQUIRE_WORKERS = env.bool("RATEJOBS_HEALTH_REQUIRE_WORKERS", default=False)
# Seconds between reconciler runs (celery beat): re-dispatches calls whose message was lost.
RATEJOBS_RECONCILE_INTERVAL = env.float("RATEJOBS_RECONCILE_INTERVAL", default=30.0)
# A dispatched call not started after this long lost its broker message (Redis restart).
RATEJOBS_STALE_DISPATCH_SECONDS = env.float("RATEJOBS_STALE_DISPATCH_SECONDS", default=120.0)
# Job callbacks (services.callbacks): attempts of one delivery, and the backoff between them
# (equal jitter: half of min(cap, base * 2**n) plus up to as much again). The defaults spread 8
# attempts over about 23 to 46 minutes. A wait longer than half the broker's visibility timeout
# goes to the broker in steps (a longer countdown would run the task twice).
RATEJOBS_CALLBACK_MAX_ATTEMPTS = env.int("RATEJOBS_CALLBACK_MAX_ATTEMPTS", default=8)
RATEJOBS_CALLBACK_BACKOFF_BASE = env.float("RATEJOBS_CALLBACK_BACKOFF_BASE", default=30.0)
RATEJOBS_CALLBACK_BACKOFF_CAP = env.float("RATEJOBS_CALLBACK_BACKOFF_CAP", default=900.0)
# Seconds one attempt may take in all (connect, send, the receiver's answer).
RATEJOBS_CALLBACK_TIMEOUT = env.float("RATEJOBS_CALLBACK_TIMEOUT", default=10.0)
# Seconds after the job finished by which a delivery's next attempt must be due: a receiver's
# Retry-After is honoured up to it (past the backoff cap), and a retry due later fails the
# delivery with that reason. By default the longest the backoff waits over all the attempts,
# plus for each attempt its timeout and a minute of queues and the reconciler's pick-up
# (3,290 s, about 55 min, with the defaults), so the backoff alone never reaches it.
RATEJOBS_CALLBACK_DEADLINE_SECONDS = env.float(
    "RATEJOBS_CALLBACK_DEADLINE_SECONDS",
    default=sum(
        backoff_ceiling(n, base=RATEJOBS_CALLBACK_BACKOFF_BASE, cap=RATEJOBS_CALLBACK_BACKOFF_CAP)
        for n in range(RATEJOBS_CALLBACK_MAX_ATTEMPTS - 1)
    )
    + RATEJOBS_CALLBACK_MAX_ATTEMPTS * (RATEJOBS_CALLBACK_TIMEOUT + 60.0),
)

# Days throttle events, and the response bodies and headers stored on calls of finished jobs,
# are kept; 0 keeps them for ever. Beat removes older ones in batches (services.retention).
RATEJOBS_KEEP_EVENTS_DAYS = env.int("RATEJOBS_KEEP_EVENTS_DAYS", default=30)
RATEJOBS_KEEP_BODIES_DAYS = env.int("RATEJOBS_KEEP_BODIES_DAYS", default=30)
# Seconds between retention runs: each works a minute at most, and also finishes purges whose
# task was lost or whose worker died halfway.
RATEJOBS_RETENTION_INTERVAL = 10 * 60

# The reconciler is a safety net run by `celery -A project beat`, not the engine: workers alone
# run jobs to completion.
CELERY_BEAT_SCHEDULE = {
    "ratejobs-reconcile": {"task": "ratejobs.reconcile", "schedule": RATEJOBS_RECONCILE_INTERVAL},
    "ratejobs-retention": {"task": "ratejobs.retention", "schedule": RATEJOBS_RETENTION_INTERVAL},
}

# --- REST API (ratejobs/rest/) ---------------------------------------------------------------
# One INFO line per throttle decision (api, job and call ids); "json" for one JSON object
# per line. Celery workers use the same format (project/celery.py).
RATEJOBS_LOG_FORMAT = env.str("RATEJOBS_LOG_FORMAT", default="text")
RATEJOBS_LOG_LEVEL = env.str("RATEJOBS_LOG_LEVEL", default="INFO")
LOGGING = logging_config(log_format=RATEJOBS_LOG_FORMAT, level=RATEJOBS_LOG_LEVEL)

# Where operators find Flower; the admin links to it when set.
RATEJOBS_FLOWER_URL = env.str("RATEJOBS_FLOWER_URL", default="")
# When set, /metrics answers only a scraper sending "Authorization: Bearer <token>". Without a
# token it answers nobody (403) unless RATEJOBS_METRICS_PUBLIC=true says it may answer anyone:
# its labels name every API, and its counts show who calls what.
RATEJOBS_METRICS_TOKEN = env("RATEJOBS_METRICS_TOKEN", default="")
RATEJOBS_METRICS_PUBLIC = env.bool("RATEJOBS_METRICS_PUBLIC", default=False)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: an anonymous request is then told 401 with `WWW-Authenticate: Token`.
        # DRF's, with bad tokens throttled per address (see "Sign-in throttle" below).
        "ratejobs.rest.authentication.ThrottledTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["ratejobs.rest.parsers.LimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "ratejobs.rest.pagination.Pagination",
    "EXCEPTION_HANDLER": "ratejobs.rest.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ratejobs API",
    "DESCRIPTION": "Batches of outbound HTTP calls against rate-limited APIs.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI's files come from drf-spectacular-sidecar (static files), not from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Path parameters as the routes' converters take them (anything else is a 404): ids and
    # indexes up to the largest a 64-bit column holds, names as slugs.
    "PATH_CONVERTER_OVERRIDES": {
        "int": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        "slug": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
    },
    # A job's status shows in a job and in a 409, a call's in a call: one enum each.
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "ratejobs.models.Job.Status",
        "CallStatusEnum": "ratejobs.models.Call.Status",
        "WindowUnitEnum": "ratejobs.limiter.config.WINDOW_UNITS",
    },
    # Every operation lists the errors it can answer, with the API's error body.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ratejobs.rest.schema.add_error_responses",
    ],
}

# --- Request size and rate ---------------------------------------------------------------
# Every REST route refuses a body over its limit with 413 before reading it
# (ratejobs/rest/middleware.py), chunked bodies included. JSON routes take 8 MiB (100,000 calls
# of about 80 bytes each), parsed in a bounded way (calls counted first, then built a batch at
# a time). Larger jobs come as JSON lines to
# /api/jobs/upload/, read line by line, memory constant in the number of lines.
RATEJOBS_MAX_REQUEST_BYTES = env.int("RATEJOBS_MAX_REQUEST_BYTES", default=8 * 1024 * 1024)
RATEJOBS_MAX_UPLOAD_BYTES = env.int("RATEJOBS_MAX_UPLOAD_BYTES", default=256 * 1024 * 1024)
RATEJOBS_MAX_CALLS_PER_UPLOAD = env.int("RATEJOBS_MAX_CALLS_PER_UPLOAD", default=1_000_000)
# The REST API reads request bodies itself; Django's cap (admin forms) must never be the one
# that refuses an API request first.
DATA_UPLOAD_MAX_MEMORY_SIZE = RATEJOBS_MAX_REQUEST_BYTES
MIDDLEWARE = ["ratejobs.rest.middleware.RequestSizeMiddleware", *MIDDLEWARE]
# Per user, for every way in (REST, admin, submit_job): jobs created through the REST API per
# period (429 with Retry-After beyond), unfinished (queued, running, paused) jobs, and calls
# not yet final over them. Superusers included: the limits protect the machine, not data.
RATEJOBS_JOB_CREATE_RATE = env.str("RATEJOBS_JOB_CREATE_RATE", default="60/min")
RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = env.int("RATEJOBS_MAX_ACTIVE_JOBS_PER_USER", default=100)
RATEJOBS_MAX_PENDING_CALLS_PER_USER = env.int(
    "RATEJOBS_MAX_PENDING_CALLS_PER_USER", default=2_000_000
)
# The admin's submit page keeps the file of a refused try for the next one (an hour, one per
# user, in the database): files up to this size, and up to this much for everyone at once.
RATEJOBS_KEPT_UPLOAD_MAX_BYTES = env.int("RATEJOBS_KEPT_UPLOAD_MAX_BYTES", default=16 * 1024 * 1024)
RATEJOBS_KEPT_UPLOADS_MAX_TOTAL_BYTES = env.int(
    "RATEJOBS_KEPT_UPLOADS_MAX_TOTAL_BYTES", default=256 * 1024 * 1024
)
# A page of calls carries response bodies (up to RATEJOBS_MAX_RESPONSE_BYTES each) up to this
# many bytes in all; the rest come with response_body_omitted, one call at a time.
RATEJOBS_MAX_PAGE_BYTES = env.int("RATEJOBS_MAX_PAGE_BYTES", default=8 * 1024 * 1024)
# The job-creation throttle counts in a cache every web process shares (a per-process cache
# would multiply the rate by the number of gunicorn workers): Redis, under its own prefix.
RATEJOBS_CACHE_URL = env.str("RATEJOBS_CACHE_URL", default=REDIS_URL)
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": RATEJOBS_CACHE_URL,
        "KEY_PREFIX": f"ratejobs:{RATEJOBS_NAMESPACE}:cache",
        # A Redis that stops answering (rather than refusing) must not hang sign-ins and job
        # submissions: their throttles give up on the cache after this and go on uncounted.
        "OPTIONS": {"socket_connect_timeout": 1.0, "socket_timeout": 2.0},
    }
}

# --- Sign-in throttle (ratejobs/login_throttle.py) ----------------------------------------
# Wrong passwords (the admin's sign-in page, any authenticate() call) are counted per username
# tried and per client address, bad REST tokens per address, in the shared cache above, over a
# window of RATEJOBS_LOGIN_LOCKOUT_SECONDS from the first failure. A username or address with
# its limit of failures is locked until that window ends: signing in is refused, even with the
# right password or token (the page says how long to wait; the REST API answers 429 with
# Retry-After). Right passwords and tokens are not counted. 0 turns a limit off. The address
# limit is the higher: it stops one address trying a few passwords on each of many usernames,
# and still lets the people behind one office's address mistype theirs.
RATEJOBS_LOGIN_FAILURES_PER_ACCOUNT = env.int("RATEJOBS_LOGIN_FAILURES_PER_ACCOUNT", default=10)
RATEJOBS_LOGIN_FAILURES_PER_ADDRESS = env.int("RATEJOBS_LOGIN_FAILURES_PER_ADDRESS", default=50)
RATEJOBS_LOGIN_LOCKOUT_SECONDS = env.int("RATEJOBS_LOGIN_LOCKOUT_SECONDS", default=15 * 60)
if RATEJOBS_LOGIN_LOCKOUT_SECONDS < 1:
    raise ImproperlyConfigured("RATEJOBS_LOGIN_LOCKOUT_SECONDS must be at least 1")
# The client's address is REMOTE_ADDR, unless this many proxies in front of the web server
# each append the address they saw to X-Forwarded-For: then the one the outermost appended.
# 0 trusts no X-Forwarded-For (anyone can send one). Behind a proxy with 0, every client has
# the proxy's address and shares one address count.
RATEJOBS_TRUSTED_PROXY_COUNT = env.int("RATEJOBS_TRUSTED_PROXY_COUNT", default=0)
AUTHENTICATION_BACKENDS = ["ratejobs.login_throttle.ThrottledModelBackend"]
