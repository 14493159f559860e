"""Asking before an action that cannot be taken back, as Django asks before a delete: the
action's URL answers a GET (or a POST without post=yes) with an "Are you sure?" page whose form
posts the same request again with post=yes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest
from django.template.response import TemplateResponse

TEMPLATE = "admin/ratejobs/action_confirmation.html"


def confirmed(request: HttpRequest) -> bool:
    """The request comes from the confirmation page's form (Django's delete uses the same
    field, post=yes)."""
    return request.method == "POST" and request.POST.get("post") == "yes"


def confirmation_page(
    request: HttpRequest,
    model_admin: admin.ModelAdmin,
    *,
    obj: Model,
    action: str,
    question: str,
    summary: Iterable[str],
    confirm_label: str,
    back_url: str,
    hidden: Sequence[tuple[str, str]] = (),
) -> TemplateResponse:
    """The confirmation page: `summary` says what will happen, line by line; `hidden` are the
    action's own fields (a block's seconds), posted back with the confirmation."""
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Are you sure?",
        "opts": model_admin.opts,
        "object": obj,
        "action": action,
        "question": question,
        "summary": list(summary),
        "confirm_label": confirm_label,
        "back_url": back_url,
        "hidden": list(hidden),
    }
    return TemplateResponse(request, TEMPLATE, context)
