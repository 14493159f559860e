"""Serializer pieces shared by the API's views."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.http import QueryDict
from django.utils.encoding import smart_str
from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers

# The JSON type each kind of field takes. DRF would convert others ("5" to 5, 5 to "5", "yes"
# to true), so a client's mistake would pass unnoticed and the schema would not be the truth.
# Query parameters are all strings and keep DRF's conversion.
_JSON_TYPES: tuple[tuple[type[serializers.Field], tuple[type, ...], str], ...] = (
    (serializers.BooleanField, (bool,), "a boolean"),
    (serializers.IntegerField, (int,), "an integer"),
    (serializers.FloatField, (int, float), "a number"),
    (serializers.CharField, (str,), "a string"),
    (serializers.ChoiceField, (str,), "a string"),
    (serializers.SlugRelatedField, (str,), "a string"),
    (serializers.ManyRelatedField, (list,), "a list"),
    (serializers.ListField, (list,), "a list"),
    (serializers.DictField, (dict,), "an object"),
)


def _json_type_error(field: serializers.Field, value: Any) -> str | None:
    if value is None:  # allow_null is the field's own business
        return None
    for kind, types, name in _JSON_TYPES:
        if isinstance(field, kind):
            # bool is an int to Python, never a number to a JSON client
            if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
                return None
            return f"Must be {name}."
    return None


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that refuses fields it does not know, so a misspelt or read-only
    field ("rat", "name" on an update) is a 400 instead of being silently ignored, and values
    of the wrong JSON type instead of converting them. The schema says so:
    `additionalProperties: false` (StrictInputSchema)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name: field for name, field in self.fields.items() if not field.read_only}
            errors = {
                str(name): ["Unknown field, or one that cannot be set."]
                for name in sorted(set(data) - set(writable), key=str)
            }
            if not isinstance(data, QueryDict):
                for name, field in writable.items():
                    if name in data and (error := _json_type_error(field, data[name])):
                        errors[name] = [error]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class NameField(serializers.SlugRelatedField):
    """A record by its name. A name no record can have (one not of `shape`, or with a NUL
    character, which PostgreSQL refuses even to compare: a 500) is refused without a query."""

    def __init__(self, *, shape: str | None = None, **kwargs: Any) -> None:
        super().__init__(slug_field="name", **kwargs)
        self.shape = None if shape is None else re.compile(shape)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data or (self.shape is not None and not self.shape.fullmatch(data)):
            self.fail("does_not_exist", slug_name=self.slug_field, value=smart_str(data))
        return super().to_internal_value(data)


class StrictInputSchema(OpenApiSerializerExtension):
    """What drf-spectacular makes of a StrictInputSerializer, plus `additionalProperties:
    false`: the server refuses fields it does not know."""

    target_class = StrictInputSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        return {**schema, "additionalProperties": False}
