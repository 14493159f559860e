"""Production settings: no development defaults for secrets, debug or hosts, and a refusal to
start on a placeholder secret."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import env

# .env.example marks every value an operator must choose with this; a copied file that still
# holds one would run with a secret everybody knows.
PLACEHOLDER = "CHANGE-ME"
# Django's own check (security.W009) asks for at least 50 characters.
MIN_SECRET_KEY_LENGTH = 50

_placeholders = sorted(name for name, value in os.environ.items() if PLACEHOLDER in value.upper())
if _placeholders:
    raise ImproperlyConfigured(
        f"{', '.join(_placeholders)} still hold the {PLACEHOLDER} placeholder of .env.example: "
        "set real values before starting in production"
    )
SECRET_KEY = env("DJANGO_SECRET_KEY")
if len(SECRET_KEY) < MIN_SECRET_KEY_LENGTH or SECRET_KEY.startswith("django-insecure"):
    raise ImproperlyConfigured(
        f"DJANGO_SECRET_KEY must be a random string of at least {MIN_SECRET_KEY_LENGTH} "
        'characters (python -c "import secrets; print(secrets.token_urlsafe(50))")'
    )
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS")

# TLS ends at the proxy in front of us, which says so in this header. DJANGO_HTTPS=false is
# for trying the stack over plain http on one's own machine: secure cookies would never be
# sent back there, and nobody could log in.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
HTTPS = env.bool("DJANGO_HTTPS", default=True)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=3600 if HTTPS else 0)
# Behind the proxy, the web container's own health check asks over plain http.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]

# Static files from the app itself (whitenoise), compressed and with hashed names, so the
# container needs no separate web server in front for them.
_after = MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1  # noqa: F405
MIDDLEWARE = [*MIDDLEWARE[:_after], "whitenoise.middleware.WhiteNoiseMiddleware",  # noqa: F405
              *MIDDLEWARE[_after:]]  # fmt: skip  # noqa: F405
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
