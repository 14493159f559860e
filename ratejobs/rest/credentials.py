"""REST endpoints for an API's credentials per customer (ApiCredential): managers list the keys,
add secrets (one, or thousands at once, all or nothing), replace and delete them. A secret is
write-only: no answer ever carries one."""

from __future__ import annotations

import re
from typing import Any

from django.http import Http404
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from ratejobs.models import ApiCredential
from ratejobs.rest.apis import CanManageApis
from ratejobs.rest.serializers import StrictInputSerializer
from ratejobs.rest.views import GenericAPIView
from ratejobs.selectors.apis import api_get, credential_list
from ratejobs.services.credentials import (
    CREDENTIAL_KEY_SHAPE,
    KEY_MAX_LENGTH,
    KEY_MESSAGE,
    MAX_CREDENTIALS_PER_REQUEST,
    MAX_SECRET_LENGTH,
    credential_delete,
    credential_replace,
    credentials_add,
)

# What a secret may hold (services.credentials.check_secret): printable ASCII and tabs.
SECRET_SHAPE = r"^[\x20-\x7e\t]+$"  # noqa: S105 (a pattern)
# Part of a key, for a search; empty: every key.
SEARCH_SHAPE = r"^[A-Za-z0-9_.-]{0,100}$"
SECRET_HELP = "Write-only: stored encrypted, never returned; sent in the API's auth_header."  # noqa: S105


class CredentialOutputSerializer(serializers.Serializer):
    key = serializers.CharField(max_length=KEY_MAX_LENGTH)
    created = serializers.DateTimeField()


def _secret_field() -> serializers.RegexField:
    return serializers.RegexField(
        SECRET_SHAPE,
        max_length=MAX_SECRET_LENGTH,
        write_only=True,
        trim_whitespace=False,
        style={"input_type": "password"},
        error_messages={"invalid": "printable ASCII, no line breaks (it is sent as a header)"},
        help_text=SECRET_HELP,
    )


class CredentialInputSerializer(StrictInputSerializer):
    key = serializers.RegexField(
        CREDENTIAL_KEY_SHAPE,
        max_length=KEY_MAX_LENGTH,
        trim_whitespace=False,
        error_messages={"invalid": KEY_MESSAGE},
        help_text="names the customer's credential in jobs and calls (credential_key); unique "
        "per API",
    )
    secret = _secret_field()


class CredentialSecretInputSerializer(StrictInputSerializer):
    secret = _secret_field()


class CredentialsAddedSerializer(serializers.Serializer):
    added = serializers.IntegerField(min_value=1, max_value=MAX_CREDENTIALS_PER_REQUEST)


class _ManagersOnly:
    """Credentials are the API's, like its own secret: managers only, reading included."""

    permission_classes = [IsAuthenticated, CanManageApis]


class ApiCredentialListView(_ManagersOnly, GenericAPIView):
    queryset = ApiCredential.objects.none()  # for the schema; reads go through selectors
    serializer_class = CredentialOutputSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "search",
                {"type": "string", "pattern": SEARCH_SHAPE, "maxLength": KEY_MAX_LENGTH},
                description="only keys containing this text",
            )
        ],
        responses=CredentialOutputSerializer(many=True),
    )
    def get(self, request: Request, name: str) -> Response:
        """The API's credential keys in key order, with when each was added; never a secret."""
        api = api_get(name=name)
        search = request.query_params.get("search", "")
        if not re.fullmatch(SEARCH_SHAPE, search):
            raise serializers.ValidationError({"search": [f"part of a key: {KEY_MESSAGE}"]})
        page = self.paginate_queryset(credential_list(api=api, search=search))
        return self.get_paginated_response(CredentialOutputSerializer(page, many=True).data)

    @extend_schema(
        request=PolymorphicProxySerializer(
            component_name="CredentialsInput",
            serializers=[CredentialInputSerializer, CredentialInputSerializer(many=True)],
            resource_type_field_name=None,
        ),
        responses={201: CredentialsAddedSerializer},
        examples=[
            OpenApiExample(
                "one customer", value={"key": "acme", "secret": "Bearer ..."}, request_only=True
            ),
            OpenApiExample(
                "several at once",
                value=[
                    {"key": "acme", "secret": "Bearer ..."},
                    {"key": "globex", "secret": "Bearer ..."},
                ],
                request_only=True,
            ),
        ],
    )
    def post(self, request: Request, name: str) -> Response:
        """Add credentials: one object, or a list of up to 10,000, all or nothing (a bad item,
        a key given twice or one that exists already is a 400 and nothing is stored)."""
        api = api_get(name=name)
        many = isinstance(request.data, list)
        serializer = CredentialInputSerializer(
            data=request.data, many=many, **({"max_length": MAX_CREDENTIALS_PER_REQUEST,
                                              "allow_empty": False} if many else {})
        )  # fmt: skip
        serializer.is_valid(raise_exception=True)
        items = serializer.validated_data if many else [serializer.validated_data]
        added = credentials_add(api=api, items=[(item["key"], item["secret"]) for item in items])
        return Response({"added": added}, status=status.HTTP_201_CREATED)


KEY_PATH_PARAMETER = OpenApiParameter(
    "key",
    {"type": "string", "pattern": CREDENTIAL_KEY_SHAPE, "maxLength": KEY_MAX_LENGTH},
    OpenApiParameter.PATH,
    description="the credential's key",
)


class ApiCredentialDetailView(_ManagersOnly, GenericAPIView):
    queryset = ApiCredential.objects.none()  # for the schema; reads go through selectors
    serializer_class = CredentialSecretInputSerializer

    def get_object(self) -> ApiCredential:
        # what OPTIONS looks at before describing PUT
        return self._credential(self.kwargs["name"], self.kwargs["key"])[1]

    def _credential(self, name: str, key: str) -> Any:
        api = api_get(name=name)
        if not re.fullmatch(CREDENTIAL_KEY_SHAPE, key):  # a key no credential can have
            raise Http404("no such credential")
        credential = credential_list(api=api).filter(key=key).first()
        if credential is None:
            raise Http404("no such credential")
        return api, credential

    @extend_schema(
        parameters=[KEY_PATH_PARAMETER],
        request=CredentialSecretInputSerializer,
        responses=CredentialOutputSerializer,
    )
    def put(self, request: Request, name: str, key: str) -> Response:
        """Replace the key's secret; calls sent from then on carry the new one."""
        api, credential = self._credential(name, key)
        serializer = CredentialSecretInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        credential = credential_replace(
            api=api, key=credential.key, secret=serializer.validated_data["secret"]
        )
        return Response(CredentialOutputSerializer(credential).data)

    @extend_schema(parameters=[KEY_PATH_PARAMETER], responses={204: None})
    def delete(self, request: Request, name: str, key: str) -> Response:
        """Delete the key; calls still naming it fail ("no credential") instead of going out
        without one."""
        api, credential = self._credential(name, key)
        credential_delete(api=api, key=credential.key)
        return Response(status=status.HTTP_204_NO_CONTENT)
