"""How the commands word a refusal."""

from __future__ import annotations

from django.core.exceptions import ValidationError


def validation_problems(exc: ValidationError) -> str:
    """A service's refusal on one line, each field error with its field."""
    if not hasattr(exc, "error_dict"):
        return "; ".join(exc.messages)
    return "; ".join(
        f"{field}: {message}"
        for field, messages in exc.message_dict.items()
        for message in messages
    )
