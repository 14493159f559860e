"""`Authorization: Bearer <token>` signs in with the same DRF token as `Token <token>`; a bad
bearer token is a 401 counted, with bad `Token` headers, by the per-address throttle. Through
Django's test client: the header as a client sends it, the real authentication classes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

JOBS = "/api/jobs/"


@pytest.fixture
def token(user: Any) -> str:
    return Token.objects.create(user=user).key


def get(authorization: str | None = None) -> Any:
    headers = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}
    return Client().get(JOBS, **headers)


@pytest.mark.parametrize("word", ["Bearer", "bearer", "Token"])
def test_a_token_signs_in_after_bearer_as_after_token(token, word):
    response = get(f"{word} {token}")
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []


def test_a_bad_bearer_token_is_a_401_that_names_both_schemes(token):
    for authorization in (f"Bearer {token}x", "Bearer", f"Bearer {token} {token}"):
        response = get(authorization)
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == "Token, Bearer"
        assert "Invalid token" in response.json()["detail"]
    # and no header at all is told the same schemes, not counted as a bad token
    anonymous = get()
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"] == "Token, Bearer"


def test_bad_bearer_tokens_count_with_bad_tokens_toward_the_address_lock(token, settings):
    # given an address allowed 3 bad tokens
    settings.RATEJOBS_LOGIN_FAILURES_PER_ADDRESS = 3
    assert get("Bearer wrong-1").status_code == 401
    assert get("Token wrong-2").status_code == 401
    assert get("Bearer wrong-3").status_code == 401
    # expect: locked, for either word and the right token too (200 would confirm a guess)
    for authorization in (f"Bearer {token}", f"Token {token}"):
        locked = get(authorization)
        assert locked.status_code == 429
        assert "Too many bad tokens from your address" in locked.json()["detail"]
        assert int(locked["Retry-After"]) > 0


def test_the_schema_says_both_words(client):
    schema = client.get("/api/schema/?format=json").json()
    scheme = schema["components"]["securitySchemes"]["tokenAuth"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "Authorization")
    assert "Bearer" in scheme["description"] and "Token" in scheme["description"]
