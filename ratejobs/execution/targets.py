"""Checks on what a user may put in a call: its path under the API's base URL, method, headers.

A call's path is always relative to the API's `base_url`, and a leading slash does not change
that: users write `/users/{id}` the way API docs print it, so with a base of
`https://api.x.com/v2` both `users/1` and `/users/1` mean `https://api.x.com/v2/users/1`. The
path may never name another scheme or host, nor climb out of the base path: the credentials
that go with the API belong to that host and that prefix only.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote, unquote, urlencode, urlsplit

ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
# Headers a call may never set itself: the credentials of the API, whatever the API calls them,
# plus Authorization, which every API's credential scheme could be sent under.
ALWAYS_PROTECTED_HEADERS = frozenset({"authorization"})
# Headers that belong to the HTTP client and the connection, not to the call: setting them
# could smuggle a second request (Content-Length, Transfer-Encoding), aim a shared connection at
# another virtual host (Host), or hand credentials to a proxy.
UNSAFE_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
# An attacker double- or triple-encodes dots ("%252e%252e") in the hope that some proxy decodes
# once more than we checked; decoding this many rounds for the climb check covers every layer
# seen in practice, and a path that still decodes further after that is rejected.
MAX_DECODE_ROUNDS = 4

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL_CHAR = re.compile(r"[\x00-\x1f\x7f]")
# RFC 9110's token, what a header name must be (the schema documents it as a pattern).
HEADER_NAME_PATTERN = r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$"
_TOKEN = re.compile(HEADER_NAME_PATTERN)
# RFC 3986 pchar plus "/" and "%" (escapes already in the path are kept as they are).
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
_QUERY_SAFE = _PATH_SAFE + "?"

QueryValue = str | int | float | bool | None
Query = Mapping[str, QueryValue | Sequence[QueryValue]]


def validate_base_url(base_url: str) -> str:
    """The API's base URL without a trailing slash; ValueError unless it is a plain http(s) URL
    with a host and no credentials, query or fragment."""
    if not isinstance(base_url, str) or not base_url:
        raise ValueError("base_url must be a non-empty string")
    return _validated_base_url(base_url)


# Remembered per base URL: every call of an upload and every attempt resolves against one.
@functools.lru_cache(maxsize=1024)
def _validated_base_url(base_url: str) -> str:
    if _has_control_chars(base_url) or "\\" in base_url or " " in base_url:
        raise ValueError("base_url contains spaces, backslashes or control characters")
    parts = urlsplit(base_url)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError("base_url must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("base_url has no host")
    try:  # what the connection will do with it: an empty or overlong label cannot be sent
        parts.hostname.encode("idna")
    except UnicodeError:
        raise ValueError("base_url's host is not a valid host name") from None
    if parts.username is not None or parts.password is not None:
        raise ValueError("base_url must not carry credentials; store them as the API credential")
    if parts.query or parts.fragment or base_url.endswith(("?", "#")):
        raise ValueError("base_url must not have a query or fragment")
    try:
        parts.port  # noqa: B018 - raises on a port out of range or not a number
    except ValueError as exc:
        raise ValueError("base_url has an invalid port") from exc
    segments = parts.path.split("/")
    if any(unquote(s) in (".", "..") for s in segments):
        raise ValueError("base_url path must not contain '.' or '..' segments")
    return f"{parts.scheme.lower()}://{parts.netloc}{parts.path.rstrip('/')}"


def resolve_url(base_url: str, path: str, query: Query | None = None) -> str:
    """The absolute URL of `path` under `base_url` (a leading slash is relative to the base
    path too), with `query` appended; ValueError when the path tries to leave the base.

    Dot segments inside the base are resolved ("a/../b" is "b"). Query values: None is left
    out, booleans become "true"/"false", a list or tuple repeats the name.
    """
    base = validate_base_url(base_url)
    if not isinstance(path, str):
        raise ValueError("path must be a string")
    _check_path(path)
    raw_path, _, path_query = path.partition("?")
    check_climb(raw_path)
    relative = _remove_dot_segments(raw_path.removeprefix("/"))
    url = base + "/" + quote(relative, safe=_PATH_SAFE) if raw_path else base
    queries = [quote(path_query, safe=_QUERY_SAFE), _encode_query(query or {})]
    if any(queries):
        url += "?" + "&".join(q for q in queries if q)
    # Belt and braces: whatever the path was, the result is on the base's scheme and host.
    resolved = urlsplit(url)
    if (resolved.scheme, resolved.netloc) != _scheme_and_netloc(base):
        raise ValueError("path must stay on the API's host")
    return url


@functools.lru_cache(maxsize=1024)
def _scheme_and_netloc(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def validate_method(method: str) -> str:
    """The method upper-cased; ValueError unless it is one of ALLOWED_METHODS."""
    if not isinstance(method, str) or method.upper() not in ALLOWED_METHODS:
        allowed = ", ".join(sorted(ALLOWED_METHODS))
        raise ValueError(f"HTTP method must be one of {allowed}")
    return method.upper()


def check_headers(headers: Mapping[str, str], protected: Iterable[str] = ()) -> None:
    """ValueError when a header would override the credentials (Authorization or a name in
    `protected`, case-insensitive), is one the HTTP client owns (Host, Content-Length, ...), or
    is malformed. Messages name the header, never its value."""
    check_header_syntax(headers)
    guarded = ALWAYS_PROTECTED_HEADERS | {name.lower() for name in protected}
    for name in headers:
        key = name.lower()
        if key in guarded:
            raise ValueError(f"header {name!r} would override the API's credentials")
        if key in UNSAFE_HEADERS:
            raise ValueError(f"header {name!r} is set by the HTTP client and may not be given")


def check_header_syntax(headers: Mapping[str, str]) -> None:
    """ValueError unless every name is an HTTP token (once, ignoring case) and every value a
    string without line breaks or other control characters. Never echoes a value."""
    seen: set[str] = set()
    for name, value in headers.items():
        # fullmatch: the pattern's `$` would also take a name that ends in a newline
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not a valid HTTP token")
        key = name.lower()
        if key in seen:
            raise ValueError(f"header {name!r} is given twice (names are case-insensitive)")
        seen.add(key)
        if not isinstance(value, str):
            raise ValueError(f"header {name!r} must have a string value")
        if _has_control_chars(value.replace("\t", " ")) or value != value.strip():
            raise ValueError(
                f"header {name!r} has a value with control characters or surrounding spaces"
            )


def _check_path(path: str) -> None:
    if _has_control_chars(path):
        raise ValueError("path must not contain control characters")
    if "\\" in path:
        raise ValueError("path must not contain backslashes")
    if "#" in path:
        raise ValueError("path must not contain a fragment ('#')")
    if path.startswith("//"):
        raise ValueError("path must be relative to base_url; '//' would name another host")
    if _SCHEME.match(path):
        raise ValueError(
            "path must be relative to base_url, not an absolute URL "
            "(a colon in the first segment reads as a scheme; write it as '/name:action')"
        )
    if _BAD_PERCENT.search(path):
        raise ValueError("path has a '%' that does not start a percent-escape")


def check_climb(raw_path: str) -> None:
    """Reject a path that leaves the base under any reading a server or proxy might give it:
    percent-escapes decoded (repeatedly), %2F and backslashes as separators, Unicode look-alike
    dots folded (NFKC) and Tomcat-style path parameters (`..;x`) stripped."""
    text = raw_path
    for _ in range(MAX_DECODE_ROUNDS):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    else:
        if unquote(text) != text:
            raise ValueError("path is percent-encoded too many times over")
    text = unicodedata.normalize("NFKC", text)
    depth = 0
    for segment in text.replace("\\", "/").split("/"):
        name = segment.split(";", 1)[0].strip()
        if name == "..":
            if depth == 0:
                raise ValueError("path must not climb out of base_url's path ('..')")
            depth -= 1
        elif name not in ("", "."):
            depth += 1


def _remove_dot_segments(relative: str) -> str:
    segments = relative.split("/")
    out: list[str] = []
    for segment in segments:
        name = unquote(segment)
        if name == ".":
            continue
        if name == "..":
            if not out:  # check_climb already refused this; never emit it regardless
                raise ValueError("path must not climb out of base_url's path ('..')")
            out.pop()
            continue
        out.append(segment)
    if segments and unquote(segments[-1]) in (".", "..") and out:
        out.append("")  # "a/b/.." is the directory "a/", as RFC 3986 resolves it
    return "/".join(out)


def _encode_query(query: Query) -> str:
    pairs: list[tuple[str, str]] = []
    for name, value in query.items():
        if not isinstance(name, str):
            raise ValueError("query parameter names must be strings")
        values = value if isinstance(value, list | tuple) else [value]
        pairs.extend((name, _query_text(v)) for v in values if v is not None)
    return urlencode(pairs, quote_via=quote)


def _query_text(value: QueryValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError("query values must be strings, numbers, booleans, None or lists of them")


def _has_control_chars(text: str) -> bool:
    return _CONTROL_CHAR.search(text) is not None


def redact_url(url: str) -> str:
    """`url` fit for logs and messages: query values and any userinfo replaced by "***", since
    some APIs take their key as a query parameter."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{pair.partition('=')[0]}=***" if "=" in pair else pair
        for pair in parts.query.split("&")
        if pair
    )
    redacted = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else parts.path
    return f"{redacted}?{query}" if query else redacted


def url_origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of `url`, lower-cased and with the scheme's default port: the unit
    a credential and a connection belong to."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port
