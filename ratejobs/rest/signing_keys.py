"""REST endpoint of the signing key that signs your job callbacks: whether you have one, and
a new one, whose secret is shown in that answer only."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from ratejobs.models import SigningKey
from ratejobs.rest.serializers import StrictInputSerializer
from ratejobs.rest.views import APIView
from ratejobs.selectors.signing_keys import signing_key_for
from ratejobs.services.callbacks import signing_key_rotate


class SigningKeyStatusSerializer(serializers.Serializer):
    exists = serializers.BooleanField(help_text="whether you have a signing key")
    created = serializers.DateTimeField(
        allow_null=True, help_text="when its current secret was made"
    )
    rotated = serializers.DateTimeField(
        allow_null=True, help_text="when its secret was last replaced; null: never"
    )


class SigningKeySecretSerializer(SigningKeyStatusSerializer):
    secret = serializers.CharField(
        min_length=1,
        help_text="shown in this answer only: keep it where your callback receiver can read "
        "it; it verifies X-Ratejobs-Signature (HMAC-SHA256 of `<t>.<body>`, keyed with this "
        "string's UTF-8 bytes)",
    )


class SigningKeyRotateSerializer(StrictInputSerializer):
    """No fields: an empty JSON object, or no body."""


def _status(key: SigningKey | None) -> dict:
    if key is None:
        return {"exists": False, "created": None, "rotated": None}
    return {"exists": True, "created": key.created, "rotated": key.rotated}


class SigningKeyView(APIView):
    @extend_schema(operation_id="signing_key_retrieve", responses=SigningKeyStatusSerializer)
    def get(self, request: Request) -> Response:
        """Whether you have a signing key for job callbacks, and when it was made; never its
        secret."""
        data = _status(signing_key_for(request.user))
        return Response(SigningKeyStatusSerializer(data).data)

    @extend_schema(
        operation_id="signing_key_rotate",
        request=SigningKeyRotateSerializer,
        responses={
            201: OpenApiResponse(
                SigningKeySecretSerializer, "the new secret, shown in this answer only"
            )
        },
    )
    def post(self, request: Request) -> Response:
        """Make your signing key, or replace its secret (the old one stops signing at once):
        201 with the secret, which is never shown again. A job with a `callback_url` needs
        one."""
        body = SigningKeyRotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key, secret = signing_key_rotate(user=request.user)
        data = {**_status(key), "secret": secret}
        response = Response(SigningKeySecretSerializer(data).data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response
