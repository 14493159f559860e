"""How the REST API reports failures: service ValidationErrors as 400s with field errors, 409
for an action the job's status rules out, 413 for a request body over the limit (Django's own
RequestDataTooBig included, should anything read `request.body`)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.settings import api_settings

from ratejobs.services.jobs import CallsInvalid


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state of the resource."
    default_code = "conflict"


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "request_too_large"


def validation_error_detail(exc: DjangoValidationError) -> dict[str, Any]:
    """A service's ValidationError as DRF field errors: `{"field": ["message", ...]}`, errors
    not tied to a field under "non_field_errors", and a job's bad calls by index under
    "calls": `{"calls": {"3": {"path": ["..."]}}}`."""
    detail = {
        api_settings.NON_FIELD_ERRORS_KEY if field == NON_FIELD_ERRORS else field: messages
        for field, messages in as_serializer_error(exc).items()
    }
    if isinstance(exc, CallsInvalid):
        detail["calls"] = {
            str(index): {
                api_settings.NON_FIELD_ERRORS_KEY if field == NON_FIELD_ERRORS else field: messages
                for field, messages in fields.items()
            }
            for index, fields in exc.call_errors.items()
        }
    return detail


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, plus: a Django ValidationError (raised by a service) is a 400, and
    Django's RequestDataTooBig a 413 like ours (DRF would let Django answer it with a 400)."""
    # Imported here: rest_framework.views loads the parser classes, which import this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(f"Request body too large: {exc}")
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(validation_error_detail(exc))
    return drf_exception_handler(exc, context)
