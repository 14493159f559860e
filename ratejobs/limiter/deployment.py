"""Which deployment's buckets a limiter uses, read from the environment the deployment reads.

Every key a deployment writes in Redis starts with `ratejobs:<namespace>:`; its limiters' keys
with `ratejobs:<namespace>:limiter`. The namespace is RATEJOBS_LIMITER_NAMESPACE (limiters shared
on purpose with another deployment), else RATEJOBS_NAMESPACE, else a hash of the database in
DATABASE_URL (namespace_for_database), else of the standalone project's own SQLite file. The
settings (project/settings/base.py) and a program outside Django (Limiter's default key_prefix)
both read it here, so a program started with the deployment's environment shares its buckets
with no prefix in its code. No Django here: this module runs where only redis is installed.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_plus, urlparse

from ratejobs.limiter.errors import NamespaceUnknown

# A namespace sits inside key names and SCAN patterns (ratejobs.limiter.buckets): no ':' (the
# separator), no glob characters and no braces (Redis Cluster's hash tags).
_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Hex digits of the database's hash: 2^40 names, so two databases meet by chance practically
# never, and a key stays short to read in redis-cli.
DERIVED_LENGTH = 10
# The checkout's root: the standalone project (project/) keeps its SQLite file there when
# DATABASE_URL is not set.
CHECKOUT_ROOT = Path(__file__).resolve().parents[2]
# The URL schemes django-environ reads as PostgreSQL (its POSTGRES_FAMILY) and their engines.
_POSTGRES_ENGINES = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "psql": "django.db.backends.postgresql",
    "pgsql": "django.db.backends.postgresql",
    "postgis": "django.contrib.gis.db.backends.postgis",
}
SQLITE_ENGINE = "django.db.backends.sqlite3"


def check_namespace(namespace: str) -> str:
    """`namespace` when it may name keys; ValueError saying what is allowed otherwise."""
    if not _NAMESPACE.match(namespace):
        raise ValueError(
            f"RATEJOBS_NAMESPACE {namespace!r}: 1-64 of A-Z a-z 0-9 _ . - (no ':', '*' or braces)"
        )
    return namespace


def namespace_for_database(database: Mapping[str, Any]) -> str:
    """A short stable name for the deployment whose truth is `database` (a DATABASES entry):
    a hash of its engine, host, port and name, or of a SQLite file's absolute path. Processes
    of one deployment (web, workers, beat) open the same database, so they agree on it."""
    engine = str(database.get("ENGINE", ""))
    name = str(database.get("NAME", ""))
    if engine.endswith("sqlite3"):
        identity = f"sqlite|{Path(name).expanduser().resolve()}"
    else:
        host = database.get("HOST") or "localhost"
        identity = f"{engine}|{host}|{database.get('PORT') or ''}|{name}"
    return hashlib.sha256(identity.encode()).hexdigest()[:DERIVED_LENGTH]


def default_database_url() -> str:
    """The standalone project's database when DATABASE_URL is not set: a SQLite file in the
    checkout."""
    return f"sqlite:///{CHECKOUT_ROOT / 'db.sqlite3'}"


def database_identity(url: str) -> dict[str, Any]:
    """ENGINE, NAME, HOST and PORT of a PostgreSQL or SQLite DATABASE_URL, as django-environ's
    Env.db_url_config gives them to the settings (the fields namespace_for_database reads).
    ValueError for another database, whose namespace must then be set."""
    if url == "sqlite://:memory:":
        return {"ENGINE": SQLITE_ENGINE, "NAME": ":memory:", "HOST": "", "PORT": ""}
    parts = urlparse(url)
    path = unquote_plus(parts.path[1:].split("?", 2)[0])
    if parts.scheme == "sqlite":
        return {"ENGINE": SQLITE_ENGINE, "NAME": path or ":memory:", "HOST": "", "PORT": ""}
    engine = _POSTGRES_ENGINES.get(parts.scheme)
    if engine is None:
        raise ValueError(
            f"DATABASE_URL: only PostgreSQL and SQLite name a namespace by themselves, not "
            f"{parts.scheme or url!r}: set RATEJOBS_NAMESPACE"
        )
    netloc = unquote(parts.netloc.rsplit("@", 1)[-1])
    if "," in netloc:  # several hosts (a libpq multi-host URL)
        hosts, ports = [], []
        for host in netloc.split(","):
            if host.startswith("["):
                end = host.find("]")
                if end != -1 and host[end + 1 : end + 2] == ":":
                    hosts.append(host[: end + 1])
                    ports.append(host[end + 2 :])
                else:
                    hosts.append(host)
                    ports.append("")
            else:
                name, colon, port = host.rpartition(":")
                if colon and port.isdigit():
                    hosts.append(name)
                    ports.append(port)
                else:
                    hosts.append(host)
                    ports.append("")
        hostname = ",".join(hosts)
        port: Any = ",".join(filter(None, ports))
    else:
        hostname, port = parts.hostname or "", parts.port
    identity = {"ENGINE": engine, "NAME": path, "HOST": hostname, "PORT": _whole(port) or ""}
    if path.startswith("/"):  # a socket directory, then the database's name
        identity["HOST"], identity["NAME"] = path.rsplit("/", 1)
    return identity


def _whole(value: Any) -> Any:
    """django-environ's _cast_int: a number's text as an int, anything else as it is."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


def deployment_namespace(environ: Mapping[str, str] | None = None) -> str:
    """The namespace of the deployment whose environment this is (os.environ by default)."""
    env = os.environ if environ is None else environ
    named = env.get("RATEJOBS_LIMITER_NAMESPACE") or env.get("RATEJOBS_NAMESPACE")
    if named:
        return check_namespace(named)
    url = env.get("DATABASE_URL")
    if not url and (CHECKOUT_ROOT / "project" / "settings").is_dir():
        url = default_database_url()  # the standalone project, run from this checkout
    if not url:
        raise NamespaceUnknown(
            "no RATEJOBS_NAMESPACE, RATEJOBS_LIMITER_NAMESPACE or DATABASE_URL in the "
            "environment: which deployment's buckets should this limiter share? Export the "
            "line `python manage.py limiter_status` prints, or pass key_prefix="
        )
    return namespace_for_database(database_identity(url))


def limiter_key_prefix(namespace: str) -> str:
    """What the keys of a deployment's limiters start with (Limiter's key_prefix)."""
    return f"ratejobs:{namespace}:limiter"


def deployment_key_prefix(environ: Mapping[str, str] | None = None) -> str:
    """The key prefix of the limiters of the deployment whose environment this is."""
    return limiter_key_prefix(deployment_namespace(environ))
