"""How the commands word a refusal: its problems as clauses of one line, then what it means
("nothing was stored"), with no stray period before a semicolon."""

from __future__ import annotations

from django.core.exceptions import ValidationError


def clause(message: str) -> str:
    """A message as a part of a line joined with "; ": without its own closing period (Django's
    and our services' messages are sentences; "1.; nothing" reads as a typo)."""
    text = message.strip()
    return text[:-1] if text.endswith(".") and not text.endswith("..") else text


def refusal(*parts: str) -> str:
    """Parts joined as clauses: refusal("line 2: bad.", "nothing was stored")."""
    return "; ".join(clause(part) for part in parts if part.strip())


def validation_problems(exc: ValidationError) -> str:
    """A service's refusal on one line, each field error with its field."""
    if not hasattr(exc, "error_dict"):
        return refusal(*exc.messages)
    return refusal(
        *(
            f"{field}: {message}"
            for field, messages in exc.message_dict.items()
            for message in messages
        )
    )
