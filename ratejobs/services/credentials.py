"""Credentials per customer: an API's secrets by key (ApiCredential), stored encrypted, added in
bulk all-or-nothing, and decrypted for the workers through a bounded per-process cache."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from ratejobs.crypto import CredentialError, decrypt_secret, encrypt_secret
from ratejobs.infra.limiters import api_limiter
from ratejobs.models import (
    CREDENTIAL_KEY_MAX_LENGTH,
    CREDENTIAL_KEY_MESSAGE,
    CREDENTIAL_KEY_PATTERN,
    Api,
    ApiCredential,
)

KEY_RE = re.compile(CREDENTIAL_KEY_PATTERN)
# The same for the REST schema (its `$` matched with fullmatch), and the column's length.
CREDENTIAL_KEY_SHAPE = r"^[A-Za-z0-9_.-]{1,100}$"
KEY_MAX_LENGTH = CREDENTIAL_KEY_MAX_LENGTH
KEY_MESSAGE = CREDENTIAL_KEY_MESSAGE
# A secret is sent as a header value: printable characters, no CR/LF (header injection).
SECRET_RE = re.compile(r"^[\x20-\x7e\t]+\Z")
MAX_SECRET_LENGTH = 4096
# Credentials one request (or one import batch) may add: a SaaS with thousands of customers
# sends them in a few requests, and one request stays well under the body limit.
MAX_CREDENTIALS_PER_REQUEST = 10_000
# Missing keys a refusal names: enough to see the pattern of a mistake.
MISSING_KEYS_SHOWN = 10
BULK_BATCH = 1000
# Decrypted secrets kept per worker process: decrypting per claim cost more CPU than sending a
# call, and thousands of customers must not grow a worker's memory without bound.
MAX_CACHED_SECRETS = 4096


def check_credential_key(key: Any) -> str:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(CREDENTIAL_KEY_MESSAGE)
    return key


def check_secret(secret: Any) -> str:
    if not isinstance(secret, str) or not secret:
        raise ValueError("a secret is a non-empty string")
    if len(secret) > MAX_SECRET_LENGTH:
        raise ValueError(f"a secret is at most {MAX_SECRET_LENGTH} characters")
    if not SECRET_RE.match(secret):
        raise ValueError("a secret is sent as a header value: printable ASCII, no line breaks")
    return secret


def credentials_add(*, api: Api, items: Iterable[tuple[str, str]], replace: bool = False) -> int:
    """Store (key, secret) pairs for `api`, all or nothing: ValidationError naming the bad
    items by position (and nothing stored) on a bad key or secret, a key given twice, or (unless
    `replace`) a key that exists already. Returns how many were stored."""
    pairs = list(items)
    if not pairs:
        raise ValidationError({"credentials": ["give at least one credential"]})
    if len(pairs) > MAX_CREDENTIALS_PER_REQUEST:
        raise ValidationError(
            {"credentials": [f"at most {MAX_CREDENTIALS_PER_REQUEST} credentials at once"]}
        )
    errors: list[str] = []
    seen: set[str] = set()
    for position, (key, secret) in enumerate(pairs):
        try:
            check_credential_key(key)
            check_secret(secret)
        except ValueError as exc:
            errors.append(f"item {position}: {exc}")
        else:
            if key in seen:
                errors.append(f"item {position}: key {key!r} given twice")
            seen.add(key)
        if len(errors) >= MISSING_KEYS_SHOWN:
            break
    if errors:
        raise ValidationError({"credentials": errors})
    with transaction.atomic():
        existing = set()
        keys = [key for key, _ in pairs]
        for start in range(0, len(keys), BULK_BATCH):
            existing.update(
                ApiCredential.objects.filter(api=api, key__in=keys[start : start + BULK_BATCH])
                .select_for_update()
                .values_list("key", flat=True)
            )
        if existing and not replace:
            shown = sorted(existing)[:MISSING_KEYS_SHOWN]
            raise ValidationError({"credentials": [
                f"{len(existing)} keys exist already (replace one with PUT): {', '.join(shown)}"
            ]})  # fmt: skip
        new = [
            ApiCredential(api=api, key=key, credential_encrypted=encrypt_secret(secret))
            for key, secret in pairs
            if key not in existing
        ]
        try:
            with transaction.atomic():  # a savepoint: a concurrent add of one key is a 400
                ApiCredential.objects.bulk_create(new, batch_size=BULK_BATCH)
        except IntegrityError:
            raise ValidationError(
                {"credentials": ["some of these keys were added meanwhile; try again"]}
            ) from None
        for key, secret in pairs:
            if key in existing:
                ApiCredential.objects.filter(api=api, key=key).update(
                    credential_encrypted=encrypt_secret(secret)
                )
    return len(pairs)


def credential_replace(*, api: Api, key: str, secret: str) -> ApiCredential:
    """Give an existing key a new secret; ApiCredential.DoesNotExist if there is none."""
    try:
        check_secret(secret)
    except ValueError as exc:
        raise ValidationError({"secret": [str(exc)]}) from None
    credential = ApiCredential.objects.get(api=api, key=key)
    credential.credential_encrypted = encrypt_secret(secret)
    credential.save(update_fields=["credential_encrypted"])
    return credential


def credential_delete(*, api: Api, key: str) -> bool:
    """Remove a key and its limiter bucket; calls still naming it fail with "no credential"
    rather than send without."""
    deleted, _ = ApiCredential.objects.filter(api=api, key=key).delete()
    if deleted:
        # robust: with Redis down the key is still deleted, and its bucket expires by itself
        transaction.on_commit(lambda: api_limiter(api, key).delete(), robust=True)
    return bool(deleted)


def missing_credential_keys(*, api: Api, keys: Iterable[str]) -> list[str]:
    """Those of `keys` that name no credential of `api`, sorted."""
    wanted = sorted(set(keys))
    found: set[str] = set()
    for start in range(0, len(wanted), BULK_BATCH):
        found.update(
            ApiCredential.objects.filter(
                api=api, key__in=wanted[start : start + BULK_BATCH]
            ).values_list("key", flat=True)
        )
    return [key for key in wanted if key not in found]


def missing_keys_error(api: Api, missing: list[str]) -> ValidationError:
    shown = ", ".join(missing[:MISSING_KEYS_SHOWN])
    extra = len(missing) - MISSING_KEYS_SHOWN
    more = f" and {extra} more" if extra > 0 else ""
    return ValidationError({"credential_key": [
        f"no credential with these keys for the API {api.name!r}: {shown}{more}"
    ]})  # fmt: skip


@dataclass(frozen=True)
class KeySecret:
    """A credential key's secret for sending, or why there is none (never the secret)."""

    secret: str | None = field(repr=False)
    error: str | None


_secrets: OrderedDict[str, str] = OrderedDict()
_secrets_lock = threading.Lock()


def _decrypted(token: str) -> str:
    # By the encrypted token: a replaced secret has a new token, so it is never served stale.
    with _secrets_lock:
        secret = _secrets.get(token)
        if secret is not None:
            _secrets.move_to_end(token)
            return secret
    secret = decrypt_secret(token)
    with _secrets_lock:
        _secrets[token] = secret
        while len(_secrets) > MAX_CACHED_SECRETS:
            _secrets.popitem(last=False)
    return secret


def key_secrets(*, api: Api, keys: Iterable[str]) -> Mapping[str, KeySecret]:
    """The secrets of `keys` for sending, in one query; a key with no credential (deleted since
    the job was submitted) or one that cannot be decrypted gets its error instead."""
    wanted = set(keys)
    tokens = dict(
        ApiCredential.objects.filter(api=api, key__in=wanted).values_list(
            "key", "credential_encrypted"
        )
    )
    found: dict[str, KeySecret] = {}
    for key in wanted:
        token = tokens.get(key)
        if token is None:
            found[key] = KeySecret(None, f"no credential with key {key!r} for this API")
            continue
        try:
            found[key] = KeySecret(_decrypted(token), None)
        except CredentialError as exc:
            found[key] = KeySecret(None, f"credential {key!r}: {exc}")
    return found
