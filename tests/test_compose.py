"""docker-compose.yml, checked without a container engine: valid against the Compose
Specification's JSON schema (kept in tests/data), every service's command exists in the
project, and each service has what production needs."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands, load_command_class
from jsonschema.validators import validator_for

from sandbox.config import parse_argv

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
LONG_RUNNING = ("postgres", "redis", "web", "worker", "beat", "flower", "sandbox")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; "$${" is an
# escaped dollar, left for the container's shell.
VARIABLE = re.compile(r"(?<!\$)\$\{(?P<name>[A-Za-z0-9_]+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = validator_for(SCHEMA)(SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def test_the_compose_file_follows_the_compose_specification(compose):
    assert schema_errors(compose) == []


def test_the_schema_check_would_catch_a_broken_file(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["web"]["replicas_count"] = 3  # not a Compose key
    broken["services"]["worker"]["depends_on"]["redis"]["condition"] = "service_ready"
    errors = schema_errors(broken)
    assert any("replicas_count" in error for error in errors)
    assert any("service_ready" in error for error in errors)


def env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if re.match(r"^[A-Z0-9_]+=", line))


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """A value as compose reads it when `env` is the project's .env."""

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"] or "", match["arg"]
        found = env.get(name)
        if found is not None and not (op.startswith(":") and found == ""):
            return found
        if op.endswith("?"):
            pytest.fail(f"compose would refuse to start: {name} {arg}")
        return arg if op.endswith("-") else ""

    return VARIABLE.sub(substitute, value).replace("$$", "$")


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    return [interpolate(arg, env_example()) for arg in argv]


def run_python(*argv: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=dict(env), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def production_env() -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings.production",
        "DJANGO_SECRET_KEY": "k" * 50,
        "DJANGO_ALLOWED_HOSTS": "localhost",
    }


@pytest.mark.slow
def test_every_service_command_exists_in_the_project(compose):
    # given each command with the values of .env.example, expect its program to accept every
    # option it is given: a typo would otherwise show only when the container starts
    celery_subcommands = set()
    for name, service in compose["services"].items():
        if "command" not in service or "image" in service and "build" not in service:
            continue  # postgres and redis run their images' own programs
        argv = command_of(service)
        if argv[:3] == ["celery", "-A", "project"]:
            celery_subcommands.add(argv[3])
            # click rejects an unknown subcommand or option before it acts on --help
            env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings.base"}
            result = run_python("-m", *argv, "--help", env=env)
            assert result.returncode == 0, (name, result.stderr[-2000:])
            if argv[3] == "flower":
                # Flower hands its own options to tornado, which click never sees
                result = run_python(
                    "-c", "import sys; from flower.options import options; "
                    "options.parse_command_line(sys.argv[1:], final=False)", *argv[3:], env=env,
                )  # fmt: skip
                assert result.returncode == 0, (name, result.stderr[-2000:])
        elif argv[:2] == ["python", "manage.py"]:
            assert argv[2] in get_commands(), name
            command = load_command_class(get_commands()[argv[2]], argv[2])
            command.create_parser("manage.py", argv[2]).parse_args(argv[3:])
        elif argv[:3] == ["python", "-m", "sandbox"]:
            config, _ = parse_argv(argv[3:])  # raises SystemExit on an unknown option
            assert config.enforced_rate < config.rate, "the demo sandbox should throttle"
        elif argv[:2] == ["gunicorn", "project.wsgi"]:
            # --check-config parses the options and loads the app with production settings
            result = run_python("-m", "gunicorn", "--check-config", *argv[1:], env=production_env())
            assert result.returncode == 0, (name, result.stderr[-2000:])
        else:
            pytest.fail(f"{name}: unknown command {argv}")
    assert celery_subcommands == {"worker", "beat", "flower"}


def test_the_command_check_would_catch_a_misspelt_option():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings.base"}
    misspelt = ["-m", "celery", "-A", "project", "worker", "--concurency", "8", "--help"]
    assert run_python(*misspelt, env=env).returncode != 0
    assert run_python("-m", "gunicorn", "--check-config", "project.wsgi", "--bnd", "0.0.0.0:8000",
                      env=production_env()).returncode != 0  # fmt: skip


def test_the_web_command_serves_the_production_settings():
    # gunicorn imports project.wsgi with the settings module the image sets
    result = run_python(
        "-c", "import gunicorn, project.wsgi; from django.conf import settings;"
        "print(settings.SETTINGS_MODULE, 'whitenoise.middleware.WhiteNoiseMiddleware' in "
        "settings.MIDDLEWARE)", env=production_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["project.settings.production", "True"]


def test_the_dockerfile_copies_what_exists_and_runs_unprivileged():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ENV DJANGO_SETTINGS_MODULE=project.settings.production" in dockerfile
    sources = [
        source
        for line in dockerfile.splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
        if not source.startswith("--")
    ]
    assert sources and all((ROOT / source).exists() for source in sources)
    # the build context leaves out local secrets, the virtualenv and local databases
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".env", ".venv", ".git", "db.sqlite3*"} <= ignored
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.MULTILINE)


def test_each_service_has_what_production_needs(compose):
    services = compose["services"]
    for name in LONG_RUNNING:
        assert services[name].get("restart") in ("always", "unless-stopped"), name
    for name in ("postgres", "redis", "web"):
        assert "healthcheck" in services[name], name
    # redis keeps its data: append-only on a named volume
    assert "--appendonly" in command_of(services["redis"])
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    # workers scale with `--scale worker=N`: nothing that names or binds one container
    assert not {"ports", "container_name"} & set(services["worker"])
    # the sandbox is for demos only; everything else starts by default
    assert services["sandbox"]["profiles"] == ["demo"]
    assert [n for n, s in services.items() if "profiles" in s] == ["sandbox"]
    # the app waits for its database to be migrated
    for name in ("web", "worker", "beat", "flower"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }
        assert services[name]["environment"]["DJANGO_SETTINGS_MODULE"] == (
            "project.settings.production"
        )
    # Flower (task arguments, revoke) never without a login, and on loopback only
    flower = services["flower"]
    assert flower["ports"] and all(p.startswith("127.0.0.1:") for p in flower["ports"])
    assert any(arg.startswith("--basic-auth=${FLOWER_BASIC_AUTH:?") for arg in flower["command"]), (
        "compose must refuse to start Flower without FLOWER_BASIC_AUTH"
    )


def test_every_variable_the_compose_file_uses_is_in_env_example():
    text = (ROOT / "docker-compose.yml").read_text()
    used = {match["name"] for match in VARIABLE.finditer(text)}
    assert used and used <= set(env_example()), used - set(env_example())


# Run in a clean interpreter: the settings module reads the environment once, at import.
SETTINGS_PROBE = """
import json, re, sys
from urllib.parse import urlsplit
from django.conf import settings
from django.http.request import validate_host
url = urlsplit(sys.argv[1])
print(json.dumps({
    "debug": settings.DEBUG,
    "database": [settings.DATABASES["default"]["ENGINE"], settings.DATABASES["default"]["HOST"]],
    "password": settings.DATABASES["default"]["PASSWORD"],
    "redis": settings.REDIS_URL,
    "broker": settings.CELERY_BROKER_URL,
    "metrics_public": settings.RATEJOBS_METRICS_PUBLIC,
    "health_host_allowed": validate_host(url.hostname, settings.ALLOWED_HOSTS),
    "health_exempt_from_https": any(
        re.search(p, url.path.lstrip("/")) for p in settings.SECURE_REDIRECT_EXEMPT
    ),
}))
"""


def edited_env_example() -> dict[str, str]:
    """.env.example as an operator leaves it: every CHANGE-ME replaced by a value of their own."""
    return {
        name: ("chosen-" + "x" * 60 if "CHANGE-ME" in value else value)
        for name, value in env_example().items()
    }


def container_environment(compose: dict[str, Any], example: dict[str, str]) -> dict[str, str]:
    web = compose["services"]["web"]
    environment = {k: interpolate(str(v), example) for k, v in web["environment"].items()}
    return {"PATH": os.environ["PATH"], **example, **environment}


def test_production_settings_refuse_the_placeholders_of_env_example(compose):
    # given `cp .env.example .env` and nothing changed, expect the app to refuse to start and
    # name every variable still holding a placeholder
    result = run_python("-c", SETTINGS_PROBE, "http://127.0.0.1:8000/healthz",
                        env=container_environment(compose, env_example()))  # fmt: skip
    assert result.returncode != 0
    for name in ("DJANGO_SECRET_KEY", "FLOWER_BASIC_AUTH", "POSTGRES_PASSWORD"):
        assert name in result.stderr
    assert env_example()["DJANGO_HTTPS"] == "true"  # https on unless someone turns it off


@pytest.mark.parametrize("secret_key", ["short-key", "django-insecure-" + "x" * 50])
def test_production_settings_refuse_a_short_or_development_secret_key(compose, secret_key):
    env = {**container_environment(compose, edited_env_example()), "DJANGO_SECRET_KEY": secret_key}
    result = run_python("-c", SETTINGS_PROBE, "http://127.0.0.1:8000/healthz", env=env)
    assert result.returncode != 0 and "DJANGO_SECRET_KEY must be" in result.stderr


def test_production_settings_load_from_env_example_and_the_compose_environment(compose):
    # given a checkout after `cp .env.example .env` and its placeholders replaced, expect the
    # app containers' environment to hold every variable production settings require, pointing
    # at the compose services, and the web health check to pass host validation and the https
    # redirect (DJANGO_HTTPS=true)
    web = compose["services"]["web"]
    example = edited_env_example()
    container_env = container_environment(compose, example)
    health_url = re.search(r"'(http://[^']+)'", " ".join(web["healthcheck"]["test"]))[1]
    result = run_python("-c", SETTINGS_PROBE, health_url, env=container_env)
    assert result.returncode == 0, result.stderr[-2000:]
    probe = json.loads(result.stdout)
    assert probe["debug"] is False and probe["metrics_public"] is False
    assert probe["database"] == ["django.db.backends.postgresql", "postgres"]
    # the same variable sets the server's password and, inside a URL, the app's
    assert probe["password"] == example["POSTGRES_PASSWORD"]
    assert probe["redis"] == probe["broker"] == "redis://redis:6379/0"
    assert probe["health_host_allowed"] and probe["health_exempt_from_https"]
