"""Serializer pieces shared by the API's views."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that refuses fields it does not know, so a misspelt or read-only
    field ("rat", "name" on an update) is a 400 instead of being silently ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(set(data) - writable, key=str)
            if unknown:
                raise serializers.ValidationError(
                    {str(name): ["Unknown field, or one that cannot be set."] for name in unknown}
                )
        return super().to_internal_value(data)
