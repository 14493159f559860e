"""The error answers of the OpenAPI schema: every operation lists each error status it can
return, with one shared body schema, derived from what the operation takes (a body, query or
header parameters, a path, a signed-in user) the way the server's stack answers them."""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "description": "Why the request failed.",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
FIELD_ERRORS_SCHEMA = {
    "type": "object",
    "description": 'Field errors: `{"field": ["message", ...]}`; errors not tied to a field '
    'under `non_field_errors`, nested ones by key or index (`{"calls": {"3": {"path": '
    '[...]}}}`); a body that is not JSON: `{"detail": "..."}`.',
    "additionalProperties": {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}},
            {"type": "object"},
        ]
    },
}
_REFS = {
    "Error": {"$ref": "#/components/schemas/Error"},
    "FieldErrors": {"$ref": "#/components/schemas/FieldErrors"},
}
# gunicorn answers a request line over its limit (4094 bytes) itself, before the API, with a
# page of its own.
_SERVER_PAGE = {"text/html": {"schema": {"type": "string"}}}
_UNSAFE_METHODS = ("post", "put", "patch", "delete")


def _implied_errors(method: str, operation: dict[str, Any]) -> dict[str, str]:
    """The error statuses the stack gives this operation, with what each means here."""
    places = {parameter["in"] for parameter in operation.get("parameters", [])}
    names = {parameter["name"] for parameter in operation.get("parameters", [])}
    has_body = "requestBody" in operation
    # drf-spectacular adds an empty requirement when signing in is optional
    signed_in = bool(operation.get("security")) and {} not in operation["security"]
    errors = {}
    if has_body or places & {"query", "header"}:
        errors["400"] = "invalid input: the errors by field"
    if signed_in:
        errors["401"] = "not signed in: no token or session, or a token that is not valid"
        errors["429"] = (
            "too many bad tokens from your address (RATEJOBS_LOGIN_FAILURES_PER_ADDRESS): "
            "Retry-After says when to try again"
        )
    if signed_in and method in _UNSAFE_METHODS:
        errors["403"] = "not allowed for your role, or a session sign-in without its CSRF token"
    if "path" in places or "page" in names:
        errors["404"] = "no such record, or one you may not see; or a page past the last one"
    if places & {"path", "query"}:
        errors["414"] = "request line longer than the web server takes (gunicorn: 4094 bytes)"
    if has_body:
        errors["413"] = "request body over the limit of the route"
        errors["415"] = "a Content-Type the operation does not take"
    return errors


def add_error_responses(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: each operation's implied errors are added where it
    does not declare them, and every declared error without a body gets the shared one (field
    errors for a 400)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR_SCHEMA)
    schemas.setdefault("FieldErrors", FIELD_ERRORS_SCHEMA)
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status, description in _implied_errors(method, operation).items():
                responses.setdefault(status, {"description": description})
            for status, response in responses.items():
                if status == "414":
                    response.setdefault("content", _SERVER_PAGE)
                elif status.startswith("4") and "content" not in response:
                    schema = _REFS["FieldErrors" if status == "400" else "Error"]
                    response["content"] = {"application/json": {"schema": schema}}
    return result
