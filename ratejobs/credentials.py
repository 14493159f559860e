"""API credentials: encrypted at rest (Fernet), or named by an environment variable."""

from __future__ import annotations

import base64
import hashlib
import os

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


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


def resolve_credential(*, credential_env: str, credential_encrypted: str) -> str | None:
    if credential_env:
        value = os.environ.get(credential_env)
        if value is None:
            raise CredentialError(f"environment variable {credential_env} is not set")
        return value
    if credential_encrypted:
        return decrypt_secret(credential_encrypted)
    return None
