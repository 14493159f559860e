"""A call's path stays under its API's base URL; methods and headers are checked."""

from __future__ import annotations

import pytest

from ratejobs.execution import check_headers, resolve_url, validate_base_url, validate_method
from ratejobs.execution.targets import redact_url

BASE = "https://api.x.com/v2"


@pytest.mark.parametrize(
    ("base", "path", "expected"),
    [
        (BASE, "users/1", "https://api.x.com/v2/users/1"),
        # a leading slash is relative to the base path, as API docs print paths
        (BASE, "/users/1", "https://api.x.com/v2/users/1"),
        (BASE + "/", "/users/1", "https://api.x.com/v2/users/1"),
        (BASE, "", "https://api.x.com/v2"),
        (BASE, "/", "https://api.x.com/v2/"),
        (BASE, "users/", "https://api.x.com/v2/users/"),
        ("https://api.x.com", "/users", "https://api.x.com/users"),
        ("https://api.x.com:8443/a/b", "c", "https://api.x.com:8443/a/b/c"),
        # dot segments that stay inside the base are resolved
        (BASE, "users/../teams/7", "https://api.x.com/v2/teams/7"),
        (BASE, "users/%2e%2e/teams", "https://api.x.com/v2/teams"),
        (BASE, "./users", "https://api.x.com/v2/users"),
        (BASE, "a/b/..", "https://api.x.com/v2/a/"),
        # an encoded slash is data (GitLab project ids), kept as it is
        (BASE, "projects/group%2Fproject", "https://api.x.com/v2/projects/group%2Fproject"),
        (BASE, "/models/m:predict", "https://api.x.com/v2/models/m:predict"),
        (BASE, "caf\u00e9 au lait", "https://api.x.com/v2/caf%C3%A9%20au%20lait"),
        (BASE, "search?q=a", "https://api.x.com/v2/search?q=a"),
        (BASE, "?q=a", "https://api.x.com/v2?q=a"),
    ],
)
def test_path_resolves_under_the_base(base, path, expected):
    assert resolve_url(base, path) == expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("..", "climb"),
        ("../v1/admin", "climb"),
        ("/../v1/admin", "climb"),
        ("users/../../admin", "climb"),
        ("%2e%2e/admin", "climb"),
        ("%2E%2e/admin", "climb"),
        (".%2e/admin", "climb"),
        ("%252e%252e/admin", "climb"),  # double-encoded
        ("..%2fadmin", "climb"),  # encoded slash read as a separator
        ("a/..%2f..%2fadmin", "climb"),
        ("a//../../admin", "climb"),
        ("..;/admin", "climb"),  # Tomcat path parameter
        ("\uff0e\uff0e/admin", "climb"),  # fullwidth dots, NFKC-folded by some servers
        ("//evil.com/x", "another host"),
        ("//evil.com", "another host"),
        ("http://x", "absolute URL"),
        ("https://evil.com/v2/users", "absolute URL"),
        ("javascript:alert(1)", "absolute URL"),
        ("users:batch", "absolute URL"),
        ("a\\b", "backslash"),
        ("\\\\evil.com\\x", "backslash"),
        ("users/1\r\nX-Injected: 1", "control"),
        ("users\x00", "control"),
        ("users/1#frag", "fragment"),
        ("users/%zz", "percent"),
        ("%25252525252e%25252525252e", "too many times"),
    ],
)
def test_path_that_leaves_the_base_is_refused(path, message):
    with pytest.raises(ValueError, match=message):
        resolve_url(BASE, path)


def test_query_mapping_is_encoded_and_appended():
    url = resolve_url(
        BASE, "/search?fixed=1", {"q": "a b&c", "tag": ["x", "y"], "on": True, "skip": None}
    )
    assert url == "https://api.x.com/v2/search?fixed=1&q=a%20b%26c&tag=x&tag=y&on=true"


def test_query_of_only_none_values_adds_nothing():
    assert resolve_url(BASE, "/users", {"page": None}) == "https://api.x.com/v2/users"


@pytest.mark.parametrize(
    "base",
    [
        "ftp://api.x.com",
        "api.x.com/v2",
        "https://",
        "https://user:pw@api.x.com",
        "https://api.x.com/v2?key=1",
        "https://api.x.com/v2#x",
        "https://api.x.com/../v2",
        "https://api.x.com:99999",
        "https://api.x.com/v 2",
    ],
)
def test_bad_base_url_is_refused(base):
    with pytest.raises(ValueError, match="base_url"):
        validate_base_url(base)


@pytest.mark.parametrize("method", ["get", "POST", "Put", "patch", "DELETE", "head", "OPTIONS"])
def test_method_is_upper_cased(method):
    assert validate_method(method) == method.upper()


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "GET ", "", "FOO"])
def test_unknown_method_is_refused(method):
    with pytest.raises(ValueError, match="must be one of"):
        validate_method(method)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Authorization", "credentials"),
        ("authorization", "credentials"),
        ("X-Api-Key", "credentials"),  # the API's own auth header, any case
        ("x-api-key", "credentials"),
        ("Host", "HTTP client"),
        ("Content-Length", "HTTP client"),
        ("Transfer-Encoding", "HTTP client"),
        ("Connection", "HTTP client"),
        ("Proxy-Authorization", "HTTP client"),
        ("Bad Name", "token"),
        ("X-Bad:", "token"),
    ],
)
def test_header_that_would_override_credentials_or_the_client_is_refused(name, message):
    with pytest.raises(ValueError, match=message):
        check_headers({name: "value"}, protected={"X-API-Key"})


def test_header_value_with_line_break_is_refused_without_echoing_it():
    with pytest.raises(ValueError) as refused:
        check_headers({"X-Note": "secret-123\r\nX-Evil: 1"}, protected=set())
    assert "secret-123" not in str(refused.value)


def test_ordinary_headers_pass():
    check_headers(
        {"Accept": "application/json", "X-Request-Id": "abc", "Content-Type": "text/plain"},
        protected={"X-API-Key"},
    )


def test_same_header_twice_in_different_case_is_refused():
    with pytest.raises(ValueError, match="twice"):
        check_headers({"Accept": "a", "accept": "b"}, protected=set())


def test_redacted_url_hides_query_values_and_userinfo():
    url = "https://user:pw@api.x.com/v2/users?api_key=s3cr3t&page=2"
    assert redact_url(url) == "https://***@api.x.com/v2/users?api_key=***&page=***"
