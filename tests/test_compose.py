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
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands
from jsonschema.validators import validator_for

from ratejobs.sandbox.config import parse_argv

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
LONG_RUNNING = ("postgres", "redis", "web", "worker", "beat", "flower", "sandbox")


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


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_every_service_command_exists_in_the_project(compose):
    celery_subcommands = set()
    for name, service in compose["services"].items():
        if "command" not in service or "image" in service and "build" not in service:
            continue  # postgres and redis run their images' own programs
        argv = command_of(service)
        if argv[:3] == ["celery", "-A", "project"]:
            celery_subcommands.add(argv[3])
        elif argv[:2] == ["python", "manage.py"]:
            assert argv[2] in get_commands(), name
        elif argv[:3] == ["python", "-m", "ratejobs.sandbox"]:
            config, _ = parse_argv(argv[3:])  # raises SystemExit on an unknown option
            assert config.enforced_rate < config.rate, "the demo sandbox should throttle"
        elif argv[0] == "gunicorn":
            assert argv[1] == "project.wsgi"
        else:
            pytest.fail(f"{name}: unknown command {argv}")
    assert celery_subcommands == {"worker", "beat", "flower"}
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings.base"}
    for subcommand in sorted(celery_subcommands):
        result = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "project", subcommand, "--help"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, (subcommand, result.stderr[-2000:])


def test_the_web_command_serves_the_production_settings():
    # gunicorn imports project.wsgi with the settings module the image sets
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings.production",
        "DJANGO_SECRET_KEY": "k" * 50,
        "DJANGO_ALLOWED_HOSTS": "localhost",
    }
    result = subprocess.run(
        [sys.executable, "-c", "import gunicorn, project.wsgi; from django.conf import settings;"
         "print(settings.SETTINGS_MODULE, 'whitenoise.middleware.WhiteNoiseMiddleware' in "
         "settings.MIDDLEWARE)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
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


def test_every_variable_the_compose_file_uses_is_in_env_example():
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", (ROOT / "docker-compose.yml").read_text()))
    example = (ROOT / ".env.example").read_text()
    listed = set(re.findall(r"^([A-Z0-9_]+)=", example, re.MULTILINE))
    assert used and used <= listed, used - listed
