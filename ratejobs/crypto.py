"""API credentials: encrypted at rest (Fernet), or named by an environment variable of the
workers under a fixed prefix (or listed by the operator), so that whoever may configure an API
cannot make a worker send any other variable of its environment (DJANGO_SECRET_KEY,
DATABASE_URL, cloud keys) to a host of their choosing."""

from __future__ import annotations

import base64
import hashlib
import os
import re

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

# Variables meant to hold API credentials; nothing else in a worker's environment is sent.
CREDENTIAL_ENV_PREFIX = "RATEJOBS_CRED_"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")


class CredentialError(Exception):
    """A credential cannot be read; the message never contains the secret."""


def _fernet() -> Fernet:
    # A dedicated key can be rotated apart from Django's; by default one is derived from
    # SECRET_KEY so a fresh install needs no extra setting.
    key = settings.RATEJOBS_CREDENTIALS_KEY
    if not key:
        digest = hashlib.sha256(f"ratejobs-credentials:{settings.SECRET_KEY}".encode()).digest()
        key = base64.urlsafe_b64encode(digest).decode()
    return Fernet(key)


def encrypt_secret(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode()


def decrypt_secret(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise CredentialError("stored credential cannot be decrypted with the current key") from exc


def check_credential_env(name: str) -> None:
    """ValueError unless `name` may hold a credential: under CREDENTIAL_ENV_PREFIX or listed in
    RATEJOBS_CREDENTIAL_ENV_ALLOW. Decided on the name alone, so the answer never tells whether
    a variable exists."""
    allowed = set(settings.RATEJOBS_CREDENTIAL_ENV_ALLOW)
    if _ENV_NAME.match(name) and (
        (name.startswith(CREDENTIAL_ENV_PREFIX) and len(name) > len(CREDENTIAL_ENV_PREFIX))
        or name in allowed
    ):
        return
    raise ValueError(
        f"credential_env must name a variable starting with {CREDENTIAL_ENV_PREFIX} (for "
        f"example {CREDENTIAL_ENV_PREFIX}GITHUB), or one the operator listed in "
        "RATEJOBS_CREDENTIAL_ENV_ALLOW"
    )


def resolve_credential(*, credential_env: str, credential_encrypted: str) -> str | None:
    if credential_env:
        try:  # again here: a row stored before the rule, or by hand, must not leak either
            check_credential_env(credential_env)
        except ValueError as exc:
            raise CredentialError(str(exc)) from None
        value = os.environ.get(credential_env)
        if value is None:
            raise CredentialError(f"environment variable {credential_env} is not set")
        return value
    if credential_encrypted:
        return decrypt_secret(credential_encrypted)
    return None
