"""Forms of the admin: submitting a job from a file or a path template, and an API's secret."""

from __future__ import annotations

import copy
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from ratejobs.admin.window_rows import WindowRowsField
from ratejobs.execution.targets import ALLOWED_METHODS
from ratejobs.limiter.config import MAX_COST
from ratejobs.models import (
    CREDENTIAL_KEY_MESSAGE,
    CREDENTIAL_KEY_PATTERN,
    MAX_PRIORITY,
    Api,
    KeptUpload,
)
from ratejobs.permissions import apis_open_to
from ratejobs.services.apis import api_validate
from ratejobs.services.kept_uploads import UploadNotKept, upload_forget, upload_keep, upload_kept
from ratejobs.uploads import NumberedCalls, calls_from_template, calls_from_upload

# The form's data naming the file kept from the last try (services.kept_uploads), and the
# box that says not to use it.
KEPT_UPLOAD_FIELD = "kept_upload"
DROP_KEPT_UPLOAD_FIELD = "kept_upload_drop"


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
    not_before = forms.DateTimeField(
        required=False, label="Not before", help_text="send nothing before this time (optional)"
    )
    deadline = forms.DateTimeField(
        required=False, help_text="cancel the calls not started by this time (optional)"
    )
    callback_url = forms.URLField(
        max_length=2000,
        required=False,
        assume_scheme="https",
        label="Callback URL",
        help_text="POST the job's summary here, signed with your signing key, when it finishes "
        "(optional; needs your signing key, made on the Signing keys page)",
    )
    credential_key = forms.RegexField(
        CREDENTIAL_KEY_PATTERN,
        max_length=100,
        required=False,
        label="Credential key",
        error_messages={"invalid": CREDENTIAL_KEY_MESSAGE},
        help_text="send the calls with this customer's credential of the API (its own secret "
        "and limiter bucket); a call may name its own in a credential_key column; empty: the "
        "API's own",
    )
    calls_file = forms.FileField(
        required=False,
        label="Calls file",
        help_text="CSV with a header row naming its columns, one call per row, or JSONL, one "
        "call (a JSON object) per line: the columns are below",
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
    cost = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_COST,
        label="Cost per call",
        help_text="with a path template: each call's estimated cost in the API's cost windows "
        "(tokens; optional); a file gives each call's own in its cost column",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["api"].queryset = apis_open_to(user).order_by("name")
        self.user = user
        self.kept: KeptUpload | None = None  # the file of the last try, used in this one
        self.not_kept = ""  # why the file of this try will not be there for the next one

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not data.get("calls_file") and not self._use_kept_upload(data):
            return data
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

    def _use_kept_upload(self, data: dict[str, Any]) -> bool:
        """Take the file kept from the last try as this one's, unless the box says not to;
        False when it has expired (an error says so)."""
        token = self.data.get(KEPT_UPLOAD_FIELD, "")
        if not token:
            return True
        if self.data.get(DROP_KEPT_UPLOAD_FIELD):
            upload_forget(user=self.user, token=token)
            return True
        kept = upload_kept(user=self.user, token=token)
        if kept is None:
            self.add_error(
                "calls_file",
                "The file of your last try is kept for an hour only, and is gone: choose it again.",
            )
            return False
        self.kept = kept
        data["calls_file"] = SimpleUploadedFile(kept.name, kept.content)
        return True

    def keep_upload_for_next_try(self) -> None:
        """After a refused try: keep its newly chosen file (replacing the one kept before), so
        the page can offer it again; the browser has emptied its file input."""
        upload = self.files.get("calls_file")
        if upload is None:
            return  # the file kept before (self.kept), if any, is offered again
        try:  # in place of the file kept before, if any
            self.kept = upload_keep(
                user=self.user, name=upload.name, stream=upload, size=upload.size
            )
        except UploadNotKept as exc:
            self.kept, self.not_kept = None, str(exc)
            upload_forget(user=self.user, token=self.data.get(KEPT_UPLOAD_FIELD, ""))

    def forget_kept_upload(self) -> None:
        """After the job was made from it."""
        if self.kept is not None:
            upload_forget(user=self.user, token=self.kept.token)

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
            cost=data.get("cost") or 0,
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
    limits = WindowRowsField(
        label="More limits",
        help_text="windows every call must also fit, besides the rate above, one a row: e.g. "
        "1,000 requests per 1 hour with a burst of 100 (how many may go at once), and 10,000 "
        "cost units (tokens) per 1 minute. Empty rows are ignored; all rows empty means none. "
        "For more rows than the page offers, save and edit again.",
    )
    clear_credential = forms.BooleanField(required=False, label="Remove the stored secret")
    credential_to_new_origin = forms.BooleanField(
        required=False,
        label="Send the credential to the new origin",
        help_text="needed when a change of base URL moves an API that has a credential to "
        "another scheme, host or port",
    )

    class Meta:
        model = Api
        fields = "__all__"
        # A plain list of checkboxes: the two-pane picker takes 350 px even with no groups, and
        # the multiple-select's help appends "Hold down Control…" to the sentence below.
        widgets = {"submitter_groups": forms.CheckboxSelectMultiple}
        labels = {
            "rate": "Rate (requests per period)",
            "period": "Period (seconds)",
            "min_rate": "Floor (requests per period)",
        }
        help_texts = {
            "rate": "requests allowed in each period; the adaptive rate never goes above it",
            "period": "the length of the window the rate counts over: 1 for a rate per second, "
            "60 per minute",
            "min_rate": "adaptive only: the rate is never cut below this, in requests per "
            "period; empty: 5 % of the rate",
            "submitter_groups": "Only members of the ticked groups (and managers) may submit "
            "jobs to this API; none ticked: everyone who may sign in.",
            "credential_env": "or the name of a variable of the workers' environment holding "
            "the secret: it must start with RATEJOBS_CRED_ (or be listed in "
            "RATEJOBS_CREDENTIAL_ENV_ALLOW)",
        }

    def clean_limits(self) -> Any:
        # Rows saved as they were shown keep the stored JSON as it is (3600, not the rows'
        # 3600.0), so an unchanged page changes nothing.
        if "limits" not in self.changed_data:
            return self["limits"].initial
        return self.cleaned_data["limits"]

    def credential_given(self) -> bool:
        """Whether the credential is given again in this change (see api_validate)."""
        data = self.cleaned_data
        return bool(
            data.get("credential")
            or data.get("clear_credential")
            or data.get("credential_to_new_origin")
            or "credential_env" in self.changed_data
        )

    def _post_clean(self) -> None:
        super()._post_clean()
        # Bad limits stop here: their field said what is wrong by row (limits_errors, as
        # api_validate would again, in its "limits[1]" words)
        if self.errors:
            return
        data = self.cleaned_data
        # The API as it would be saved, credential included, checked by the same service the
        # REST API uses, so its errors show on the form instead of failing the save.
        api = copy.copy(self.instance)
        if data.get("clear_credential"):
            api.credential_encrypted = ""
        elif data.get("credential"):
            api.credential_encrypted = "(new)"
        try:
            api_validate(api=api, credential_given=self.credential_given())
        except ValidationError as exc:
            self._update_errors(exc)
