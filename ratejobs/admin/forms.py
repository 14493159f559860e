"""Forms of the admin: submitting a job from a file or a path template, and an API's secret."""

from __future__ import annotations

from typing import Any

from django import forms

from ratejobs.execution.urls import ALLOWED_METHODS
from ratejobs.models import MAX_PRIORITY, Api
from ratejobs.uploads import NumberedCalls, calls_from_template, calls_from_upload


class JobSubmitForm(forms.Form):
    """A job's calls come either from an uploaded file or from a path template and values."""

    api = forms.ModelChoiceField(queryset=Api.objects.order_by("name"), label="API")
    name = forms.CharField(max_length=200)
    priority = forms.IntegerField(
        min_value=1,
        max_value=MAX_PRIORITY,
        initial=1,
        help_text="a job of priority 2 gets twice the share of its API as a job of priority 1",
    )
    calls_file = forms.FileField(
        required=False,
        label="Calls file",
        help_text="CSV with a header row (method, path, query, headers, json, body) or JSONL, "
        "one call per line",
    )
    method = forms.ChoiceField(
        choices=[(m, m) for m in sorted(ALLOWED_METHODS)], initial="GET", required=False
    )
    path_template = forms.CharField(
        max_length=2000,
        required=False,
        help_text="or a path with one placeholder, such as /users/{id}",
    )
    values = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8}),
        required=False,
        help_text="one value per line for the placeholder",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        has_file = bool(data.get("calls_file"))
        has_template = bool(data.get("path_template") or data.get("values"))
        if has_file == has_template:
            raise forms.ValidationError(
                "Give either a calls file or a path template with values, not both."
                if has_file
                else "Give a calls file, or a path template with values."
            )
        if has_template and not (data.get("path_template") and data.get("values")):
            raise forms.ValidationError("A path template needs values, one per line.")
        return data

    def call_specs(self) -> NumberedCalls:
        """The calls, read lazily (a 100,000-row file is never held whole in memory); an
        UploadError arises while they are read."""
        data = self.cleaned_data
        upload = data.get("calls_file")
        if upload:
            upload.seek(0)
            return calls_from_upload(upload.name, upload)
        return calls_from_template(
            method=data.get("method") or "GET",
            path_template=data["path_template"],
            values=data["values"].splitlines(),
        )


class ApiAdminForm(forms.ModelForm):
    """The secret is write-only: the page never shows it, only whether one is stored."""

    base_url = forms.URLField(max_length=2000, assume_scheme="https")

    credential = forms.CharField(
        required=False,
        label="New credential",
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="sent in the auth header; stored encrypted. Leave empty to keep the stored "
        "secret.",
    )
    clear_credential = forms.BooleanField(required=False, label="Remove the stored secret")

    class Meta:
        model = Api
        fields = "__all__"
