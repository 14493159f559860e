"""Writes on APIs, and the shared limiter each one is paced by."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from ratejobs.crypto import check_credential_env, encrypt_secret
from ratejobs.execution.outbound import check_url_allowed, policy_for
from ratejobs.execution.targets import (
    ALWAYS_PROTECTED_HEADERS,
    UNSAFE_HEADERS,
    check_header_syntax,
    check_headers,
    url_origin,
    validate_base_url,
)
from ratejobs.infra.connections import redis_client
from ratejobs.infra.limiters import api_limiter
from ratejobs.limiter import Feedback
from ratejobs.limiter.buckets import reset_key_buckets
from ratejobs.limiter.config import MAX_WINDOWS, Window
from ratejobs.limiter.cost import COST_JSON_FIELD
from ratejobs.models import Api, ThrottleEvent, api_windows
from ratejobs.namespace import limiter_key_prefix

logger = logging.getLogger(__name__)

# Limits the REST API and the admin may change on a live API.
EDITABLE_FIELDS = (
    "base_url",
    "rate",
    "period",
    "burst",
    "max_concurrency",
    "adaptive",
    "min_rate",
    "max_attempts",
    "max_throttled_retries",
    "timeout",
    "default_headers",
    "auth_header",
    "idempotency_header",
    "credential_env",
    "limits",
    "cost_header",
    "cost_json_field",
)


def check_outbound_url(url: str, *, field: str) -> None:
    """ValidationError under `field` unless `url` may be called: stricter than URLField (http(s)
    only, no credentials, query or dot segments), and loopback, private and link-local (cloud
    metadata) hosts only where the operator allows them."""
    try:
        validate_base_url(url)
        check_url_allowed(url, policy_for(settings.RATEJOBS_OUTBOUND_ALLOW))
    except ValueError as exc:
        raise ValidationError({field: str(exc).replace("base_url", field)}) from exc


def _validate(api: Api) -> None:
    api.full_clean()
    check_outbound_url(api.base_url, field="base_url")
    limits = limits_errors(api.limits)
    if limits:
        raise ValidationError({"limits": limits})
    # stored canonical: every window with its unit
    api.limits = [window.as_json() for window in api_windows(api.limits)]
    try:
        api.limiter_config()
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc
    if not isinstance(api.default_headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in api.default_headers.items()
    ):
        raise ValidationError({"default_headers": "must map header names to string values"})


# Header names a credential may not be sent under: the connection's and the HTTP client's own
# (a secret there is lost, or smuggles a second request), and Cookie, which is the user's.
FORBIDDEN_AUTH_HEADERS = UNSAFE_HEADERS | {"cookie"}


def _validate_credentials(api: Api) -> None:
    errors: dict[str, str] = {}
    if api.credential_env and api.credential_encrypted:
        errors["credential"] = (
            "give credential or credential_env, not both (set the other one to an empty string)"
        )
    if api.credential_env:
        try:
            check_credential_env(api.credential_env)
        except ValueError as exc:
            errors["credential_env"] = str(exc)
    try:
        check_header_syntax({api.auth_header: ""})
        if api.auth_header.lower() in FORBIDDEN_AUTH_HEADERS:
            raise ValueError(
                f"auth_header may not be {api.auth_header!r}: that header belongs to the "
                "connection or the HTTP client, not to a credential"
            )
    except ValueError as exc:
        errors["auth_header"] = str(exc)
    if not errors.get("auth_header") and isinstance(api.default_headers, dict):
        try:  # names that are HTTP tokens, none of them the credential's or the client's
            check_headers(api.default_headers, protected={api.auth_header})
        except ValueError as exc:
            errors["default_headers"] = str(exc)
    if errors:
        raise ValidationError(errors)


WINDOW_FIELDS = ("rate", "period", "burst", "unit")
_REQUIRED_WINDOW_FIELDS = ("rate", "period", "burst")


def limits_errors(limits: object) -> list[str]:
    """What is wrong with an API's `limits`, one message per problem naming the window and its
    field (`limits[1].period: ...`); empty when they are good."""
    if not isinstance(limits, list):
        return ['must be a list of windows, e.g. [{"rate": 1000, "period": 3600, "burst": 100}]']
    if len(limits) > MAX_WINDOWS:
        return [f"at most {MAX_WINDOWS} windows besides rate/period/burst ({len(limits)} given)"]
    errors = []
    labels: dict[str, int] = {}
    for index, item in enumerate(limits):
        where = f"limits[{index}]"
        if not isinstance(item, dict):
            errors.append(f"{where}: must be an object with rate, period, burst (and unit)")
            continue
        unknown = sorted(str(name) for name in set(item) - set(WINDOW_FIELDS))
        missing = [name for name in _REQUIRED_WINDOW_FIELDS if name not in item]
        errors += [f"{where}.{name}: unknown field (use {', '.join(WINDOW_FIELDS)})"
                   for name in unknown]  # fmt: skip
        errors += [f"{where}.{name}: required" for name in missing]
        if unknown or missing:
            continue
        try:
            label = Window(**item).label
        except ValueError as exc:
            # Window's messages start with the field they are about ("period must be ...")
            for message in str(exc).split("; "):
                name, _, rest = message.partition(" must ")
                if name in WINDOW_FIELDS:
                    errors.append(f"{where}.{name}: must {rest}")
                else:  # "rate / period must be ...": about two fields
                    errors.append(f"{where}: {message}")
            continue
        # the label names the window in metrics and pages: one window per label
        if label in labels:
            errors.append(f"{where}: the same rate, period and unit as limits[{labels[label]}]")
        labels.setdefault(label, index)
    return errors


def _validate_cost_fields(api: Api) -> None:
    errors = {}
    if api.cost_header:
        try:
            check_header_syntax({api.cost_header: ""})
        except ValueError as exc:
            errors["cost_header"] = str(exc)
    if api.cost_json_field and not COST_JSON_FIELD.fullmatch(api.cost_json_field):
        errors["cost_json_field"] = (
            "must be a dotted path of names (letters, digits, _ and -) into the JSON response, "
            "e.g. usage.total_tokens"
        )
    if errors:
        raise ValidationError(errors)


def _validate_idempotency_header(api: Api) -> None:
    name = api.idempotency_header
    if not name:
        return
    try:
        check_header_syntax({name: ""})
    except ValueError as exc:
        raise ValidationError({"idempotency_header": str(exc)}) from exc
    key = name.lower()
    problem = ""
    if key in FORBIDDEN_AUTH_HEADERS | ALWAYS_PROTECTED_HEADERS:
        problem = "that header belongs to the connection, the HTTP client or a credential"
    elif key == api.auth_header.lower():
        problem = "that is the auth_header, which carries the credential"
    elif isinstance(api.default_headers, dict) and key in {
        str(default).lower() for default in api.default_headers
    }:
        # One value for every call would make every call after the first a replay.
        problem = "it is also a default header; remove it from default_headers"
    if problem:
        raise ValidationError({"idempotency_header": f"may not be {name!r}: {problem}"})


def api_validate(*, api: Api, credential_given: bool) -> None:
    """Every check on an API about to be saved, new or changed; ValidationError by field.

    A credential belongs to the origin (scheme, host, port) it was given for: moving an API
    that has one to another origin needs `credential_given` (the secret, credential_env or
    the removal sent again in the same change), or a user who may edit the base URL could
    carry a secret they never saw to a host of their own."""
    _validate(api)
    _validate_credentials(api)
    _validate_idempotency_header(api)
    _validate_cost_fields(api)
    stored = Api.objects.filter(pk=api.pk).values("base_url", "credential_env",
                                                   "credential_encrypted").first()  # fmt: skip
    if (
        stored is not None
        and (stored["credential_env"] or stored["credential_encrypted"])
        and url_origin(stored["base_url"]) != url_origin(api.base_url)
        and not credential_given
    ):
        raise ValidationError({"base_url": (
            "this API has a credential, which was given for its current origin: to move it to "
            "another scheme, host or port, send the credential (or credential_env) again in the "
            'same change, or credential "" to remove it'
        )})  # fmt: skip


@transaction.atomic
def api_create(
    *, credential: str | None = None, submitter_groups: Iterable[Group] | None = None,
    **fields: Any,
) -> Api:  # fmt: skip
    api = Api(**fields)
    if credential:
        api.credential_encrypted = encrypt_secret(credential)
    api_validate(api=api, credential_given=True)
    try:
        with transaction.atomic():  # a savepoint: the caller's transaction stays usable
            api.save()
    except IntegrityError:
        # a concurrent create of the same name committed between the check and the insert
        raise ValidationError({"name": [f"An API named {api.name!r} already exists."]}) from None
    if submitter_groups is not None:
        api.submitter_groups.set(submitter_groups)
    # robust: with Redis down the API is still saved; workers configure the limiter from
    # the database when they first use it.
    transaction.on_commit(lambda: api_limiter(api).configure(api.limiter_config()), robust=True)
    return api


@transaction.atomic
def api_update(
    *, api: Api, credential: str | None = None, credential_given: bool | None = None,
    submitter_groups: Iterable[Group] | None = None, **fields: Any,
) -> Api:  # fmt: skip
    """Change limits live: workers pick them up at their next grant. `credential`: None keeps
    the stored secret, "" removes it. `credential_given` (by default: a credential or
    credential_env is among the changes) allows a move to another origin."""
    unknown = set(fields) - set(EDITABLE_FIELDS)
    if unknown:
        raise ValidationError(f"cannot change {', '.join(sorted(unknown))}")
    if credential_given is None:
        credential_given = credential is not None or "credential_env" in fields
    for name, value in fields.items():
        setattr(api, name, value)
    if credential is not None:
        api.credential_encrypted = encrypt_secret(credential) if credential else ""
    api_validate(api=api, credential_given=credential_given)
    # Compared with the stored row under its lock (the admin hands over an instance its form
    # already changed), so two concurrent changes get two versions and Redis ends with the
    # limits the database keeps.
    stored = Api.objects.select_for_update().get(pk=api.pk)
    api.limits_version = stored.limits_version
    if api.limiter_config() != stored.limiter_config():
        api.limits_version += 1
    api.save()
    if submitter_groups is not None:
        api.submitter_groups.set(submitter_groups)
    # robust: with Redis down the change is still saved; workers see the limiter's older version
    # and write these limits at their next grant.
    transaction.on_commit(lambda: api_limiter(api).configure(api.limiter_config()), robust=True)
    return api


def api_block(*, api: Api, seconds: float) -> Feedback:
    """Stop every worker calling the API for `seconds` (an operator's decision, recorded)."""
    feedback = api_limiter(api).block(seconds)
    ThrottleEvent.objects.create(api=api, kind=ThrottleEvent.Kind.BLOCKED, retry_after=seconds)
    fields = {"api": api.name, "events": str(ThrottleEvent.Kind.BLOCKED), "blocked_for": seconds}
    logger.info("throttle decision: api=%(api)s manual block of every worker for %(blocked_for)gs",
                fields, extra=fields)  # fmt: skip
    return feedback


def api_limiter_reset(*, api: Api) -> int:
    """Reset the API's limiter and every credential key's bucket; returns how many key buckets
    were reset."""
    limiter = api_limiter(api)
    limiter.reset()
    limiter.configure(api.limiter_config())
    return reset_key_buckets(redis_client(), api.name, key_prefix=limiter_key_prefix())
