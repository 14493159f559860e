"""Requests are built under their API, with credentials added last and never shown."""

from __future__ import annotations

import json

import pytest

from ratejobs.execution import HttpRequest, build_request

SECRET = "tok-s3cr3t-value"


def test_build_request_resolves_the_path_and_adds_credentials_last():
    request = build_request(
        method="post",
        base_url="https://api.x.com/v2",
        path="/users/7",
        query={"expand": "teams"},
        headers={"Accept": "application/json"},
        json={"name": "Ann"},
        credentials={"Authorization": f"Bearer {SECRET}"},
    )
    assert request.method == "POST"
    assert request.url == "https://api.x.com/v2/users/7?expand=teams"
    assert request.headers == {
        "Accept": "application/json",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {SECRET}",
    }
    assert json.loads(request.body) == {"name": "Ann"}


@pytest.mark.parametrize("name", ["Authorization", "X-Api-Key", "x-api-key"])
def test_call_headers_cannot_override_credentials(name):
    with pytest.raises(ValueError, match="credentials"):
        build_request(
            method="GET",
            base_url="https://api.x.com",
            path="/me",
            headers={name: "mine"},
            credentials={"X-API-Key": SECRET},
        )


def test_call_cannot_leave_its_api():
    with pytest.raises(ValueError, match="relative"):
        build_request(method="GET", base_url="https://api.x.com/v2", path="https://evil.com/")


def test_body_and_json_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        build_request(method="POST", base_url="https://a.x", path="/", body=b"x", json={})


def test_repr_masks_header_values_and_query_values():
    request = HttpRequest(
        "GET",
        f"https://api.x.com/v2/users?api_key={SECRET}",
        {"Authorization": f"Bearer {SECRET}", "Accept": "text/plain"},
        b"body",
    )
    for text in (repr(request), str(request), f"{request}", repr([request])):
        assert SECRET not in text
        assert "'Authorization': '***'" in text and "<4 bytes>" in text


def test_malformed_header_value_is_refused_without_echoing_it():
    with pytest.raises(ValueError) as refused:
        HttpRequest("GET", "https://a.x/", {"Authorization": f"Bearer {SECRET}\r\nX: 1"})
    assert SECRET not in str(refused.value)


def test_headers_are_copied_so_later_changes_do_not_leak_in():
    headers = {"Accept": "a"}
    request = HttpRequest("GET", "https://a.x/", headers)
    headers["Accept"] = "b"
    assert request.headers["Accept"] == "a"


def test_build_request_names_the_credential_headers_and_the_base_for_redirects():
    request = build_request(
        method="GET",
        base_url="https://api.x.com/v2/",
        path="users",
        credentials={"X-Api-Key": SECRET},
    )
    assert request.credential_headers == frozenset({"x-api-key"})
    assert request.base_url == "https://api.x.com/v2"
    assert SECRET not in repr(request)


def test_a_request_built_without_credentials_has_none_to_drop():
    request = build_request(method="GET", base_url="https://api.x.com", path="/")
    assert request.credential_headers == frozenset() and request.base_url == "https://api.x.com"
    assert HttpRequest("GET", "https://a.x/").base_url is None
