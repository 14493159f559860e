"""System checks for a project that installs ratejobs: what it needs beside it (errors), and
what it does without but should not (warnings), each saying the line that fixes it."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

# The REST API (DRF and its tokens), its schema and Swagger UI's files (served locally).
REQUIRED_APPS = (
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
)
REQUEST_SIZE_MIDDLEWARE = "ratejobs.rest.middleware.RequestSizeMiddleware"
THROTTLED_BACKEND = "ratejobs.login_throttle.ThrottledModelBackend"


@register(Tags.compatibility)
def check_host_project(app_configs: Any = None, **_: Any) -> list[Any]:
    problems: list[Any] = []
    missing = [name for name in REQUIRED_APPS if not apps.is_installed(name)]
    if missing:
        problems.append(
            Error(
                f"ratejobs needs {', '.join(missing)} in INSTALLED_APPS",
                hint="see docs/install.md: the apps ratejobs runs on come before it",
                id="ratejobs.E001",
            )
        )
    if REQUEST_SIZE_MIDDLEWARE not in settings.MIDDLEWARE:
        problems.append(
            Warning(
                "REST requests over RATEJOBS_MAX_REQUEST_BYTES are read before they are refused",
                hint=f'put "{REQUEST_SIZE_MIDDLEWARE}" first in MIDDLEWARE',
                id="ratejobs.W001",
            )
        )
    if THROTTLED_BACKEND not in settings.AUTHENTICATION_BACKENDS:
        problems.append(
            Warning(
                "wrong passwords are not counted: the sign-in throttle is off",
                hint=f'AUTHENTICATION_BACKENDS = ["{THROTTLED_BACKEND}"]',
                id="ratejobs.W002",
            )
        )
    return problems
