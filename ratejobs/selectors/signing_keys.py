"""Reads on signing keys: whether a user has one and since when, never its secret."""

from __future__ import annotations

from typing import Any

from ratejobs.models import SigningKey


def signing_key_for(user: Any) -> SigningKey | None:
    return SigningKey.objects.filter(user=user).defer("secret_encrypted").first()
