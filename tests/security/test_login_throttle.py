"""Guessing passwords and tokens is throttled: 40 wrong passwords on the
admin's sign-in page in 8 s, then the right one, signed in. Now wrong passwords are counted per
username and per client address, bad tokens per address, in the Redis every gunicorn worker
shares; past the limit signing in is refused, the right password too, with how long to wait.

Against a real gunicorn, each on a Redis namespace of its own so that no test, and no earlier
run within the lockout window, sees another's counts. The servers run the tests' settings,
whose only difference that matters here is a fast password hasher: production's PBKDF2 costs
about half a second a guess on this machine, which the throttle does not depend on."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from rest_framework.authtoken.models import Token

from devtools.devredis import free_port
from tests.rest.realserver import Server, web_server  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

PASSWORD = "the-right-password"
# Django's own answer to a wrong password on the admin's page, and ours to a locked one (the
# window is 15 minutes by default; a slow machine may take a minute of it to guess).
WRONG = "Please enter the correct username and password"
ACCOUNT_LOCKED = r"Too many failed sign-ins for this account\. Try again in 1[45] minutes;"
ADDRESS_LOCKED = r"Too many failed sign-ins from your address\. Try again in \d+ minutes;"
ADMIN = "/admin/"


@pytest.fixture
def server_for(
    web_server: Callable[..., Server],  # noqa: F811
    unique_name: str,
    redis_client: Any,
) -> Iterator[Callable[..., Server]]:
    """gunicorn with two workers under this test's own Redis namespace (its cache, where the
    counts live, included); the test's keys are removed afterwards."""

    def start(**env: str) -> Server:
        return web_server(
            workers=2,
            DJANGO_SETTINGS_MODULE="project.settings.test",
            RATEJOBS_NAMESPACE=unique_name,
            **env,
        )

    yield start
    keys = list(redis_client.scan_iter(match=f"ratejobs:{unique_name}:*"))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture
def account(django_user_model: Any) -> Callable[[str], Any]:
    def make(username: str) -> Any:
        return django_user_model.objects.create_user(username, password=PASSWORD, is_staff=True)

    return make


def sign_in(server: Server, username: str, password: str, address: str | None = None) -> Any:
    """The admin's sign-in page as a browser uses it, from `address` when the server trusts a
    proxy (X-Forwarded-For); the answer to the form, redirects not followed."""
    session = requests.Session()
    if address is not None:
        session.headers["X-Forwarded-For"] = address
    page = f"{server.url}/admin/login/"
    session.get(page, timeout=30)
    form = {
        "username": username,
        "password": password,
        "next": ADMIN,
        "csrfmiddlewaretoken": session.cookies["csrftoken"],
    }
    return session.post(page, data=form, allow_redirects=False, timeout=30)


def signed_in(answer: Any) -> bool:
    return answer.status_code == 302 and answer.headers["Location"] == ADMIN


def refused_with(answer: Any, message: str) -> bool:
    """The sign-in page again, saying `message` (a pattern), and no session."""
    no_session = "sessionid" not in answer.cookies
    said = re.search(message, answer.text) is not None
    return answer.status_code == 200 and said and no_session


def api_get(server: Server, token: str, address: str | None = None) -> Any:
    headers = {"Authorization": f"Token {token}"}
    if address is not None:
        headers["X-Forwarded-For"] = address
    return requests.get(f"{server.url}/api/jobs/", headers=headers, timeout=30)


@pytest.mark.slow
def test_eleven_wrong_passwords_lock_the_account_even_against_the_right_one(server_for, account):
    # given: the defaults (10 failures per account, 50 per address, in 15 minutes)
    account("victim")
    account("bystander")
    server = server_for()
    # when: the guesser's 11 wrong passwords, then the right one
    guesses = [sign_in(server, "victim", f"guess-{n}") for n in range(11)]
    right = sign_in(server, "victim", PASSWORD)
    # expect: 9 told "wrong"; the 10th that the account is now locked, and how long for; the
    # 11th and the right password refused with that message, and no session
    assert all(refused_with(answer, WRONG) for answer in guesses[:9])
    assert all(refused_with(answer, ACCOUNT_LOCKED) for answer in [*guesses[9:], right])
    assert "even with the right password" in right.text
    # and: the lock is on the account, not the address: another account there still signs in
    assert signed_in(sign_in(server, "bystander", PASSWORD))
    # and: the operator's log names the username and the address, never a password
    log = server.log.read_text()
    assert "login throttle: a wrong password for 'victim' from 127.0.0.1 locked the account" in log
    assert "refused a password for 'victim' from 127.0.0.1: the account is locked for" in log
    assert "guess-" not in log and PASSWORD not in log


@pytest.mark.slow
def test_one_address_trying_many_usernames_is_locked_at_the_address_limit(server_for, account):
    # given: a server behind one proxy (X-Forwarded-For), 4 failures per address
    for name in ("ann", "bob", "bystander"):
        account(name)
    server = server_for(
        RATEJOBS_TRUSTED_PROXY_COUNT="1",
        RATEJOBS_LOGIN_FAILURES_PER_ADDRESS="4",
    )
    sprayer, colleague = "203.0.113.7", "203.0.113.8"
    # when: one wrong password each for 4 usernames, from one address
    tries = [sign_in(server, name, "Summer2024!", sprayer) for name in ("ann", "bob", "cy", "di")]
    # expect: the 4th locks the address; a right password from it is refused too
    assert all(refused_with(answer, WRONG) for answer in tries[:3])
    assert refused_with(tries[3], ADDRESS_LOCKED)
    assert refused_with(sign_in(server, "bystander", PASSWORD, sprayer), ADDRESS_LOCKED)
    # and: the same accounts from another address sign in (each has one failure of 10)
    assert signed_in(sign_in(server, "bystander", PASSWORD, colleague))
    assert signed_in(sign_in(server, "ann", PASSWORD, colleague))
    assert "refused a password for 'bystander' from 203.0.113.7: the address is locked" in (
        server.log.read_text()
    )


@pytest.mark.slow
def test_x_forwarded_for_is_not_trusted_by_default(server_for, account):
    # given: no proxy trusted (the default) and 3 failures per address
    account("bystander")
    server = server_for(RATEJOBS_LOGIN_FAILURES_PER_ADDRESS="3")
    # when: each guess claims another address in X-Forwarded-For
    claims = ("198.51.100.1", "198.51.100.2", "198.51.100.3")
    guesses = [sign_in(server, f"user{n}", "guess", claim) for n, claim in enumerate(claims)]
    # expect: all three counted against the connection's own address, which the third locked
    assert all(refused_with(answer, WRONG) for answer in guesses[:2])
    assert refused_with(guesses[2], ADDRESS_LOCKED)
    assert refused_with(sign_in(server, "bystander", PASSWORD, "198.51.100.4"), ADDRESS_LOCKED)
    assert "refused a password for 'bystander' from 127.0.0.1" in server.log.read_text()


@pytest.mark.slow
def test_right_passwords_are_not_failures(server_for, account):
    # given: 2 failures per account; expect: any number of sign-ins, and one typo, lock nothing
    account("busy")
    server = server_for(RATEJOBS_LOGIN_FAILURES_PER_ACCOUNT="2")
    assert all(signed_in(sign_in(server, "busy", PASSWORD)) for _ in range(4))
    assert refused_with(sign_in(server, "busy", "typo"), WRONG)
    assert signed_in(sign_in(server, "busy", PASSWORD))


@pytest.mark.slow
def test_bad_tokens_from_an_address_are_429_with_retry_after(server_for, account):
    # given: a server behind one proxy, 3 failures per address; a user with a token
    person = account("apiuser")
    good = Token.objects.create(user=person).key
    server = server_for(
        RATEJOBS_TRUSTED_PROXY_COUNT="1",
        RATEJOBS_LOGIN_FAILURES_PER_ADDRESS="3",
    )
    guesser, elsewhere = "192.0.2.66", "192.0.2.77"
    # when: 4 guessed tokens from one address
    answers = [api_get(server, f"{n:040x}", guesser) for n in range(4)]
    # expect: 401 for the 3 the limit allows, then 429 with Retry-After, in the API's format
    assert [answer.status_code for answer in answers] == [401, 401, 401, 429]
    refused = answers[3]
    assert 0 < int(refused.headers["Retry-After"]) <= 15 * 60
    assert refused.headers["Content-Type"] == "application/json"
    assert refused.json()["detail"].startswith("Too many bad tokens from your address: 3 in 15")
    assert "Expected available in" in refused.json()["detail"]
    # and: a right token from that address is refused too (or 200 against 429 would tell the
    # guesser which guess was right); from another address it works
    assert api_get(server, good, guesser).status_code == 429
    assert api_get(server, good, elsewhere).status_code == 200
    # and: bad tokens do not lock the address out of the admin's sign-in page
    assert signed_in(sign_in(server, "apiuser", PASSWORD, guesser))
    log = server.log.read_text()
    assert "login throttle: a bad token from 192.0.2.66 locked the address" in log
    assert "refused a token from 192.0.2.66: the address is locked for" in log
    assert good not in log and f"{1:040x}" not in log


@pytest.mark.slow
def test_with_the_cache_down_signing_in_works_uncounted(server_for, account):
    # given: the server's cache on a port nobody listens on (its Redis restarting), 1 failure
    # per account and per address
    person = account("steady")
    good = Token.objects.create(user=person).key
    server = server_for(
        RATEJOBS_CACHE_URL=f"redis://127.0.0.1:{free_port()}/0",
        RATEJOBS_LOGIN_FAILURES_PER_ACCOUNT="1",
        RATEJOBS_LOGIN_FAILURES_PER_ADDRESS="1",
    )
    # expect: passwords and tokens checked as ever (no 500, no lock), with a warning
    assert refused_with(sign_in(server, "steady", "typo"), WRONG)
    assert signed_in(sign_in(server, "steady", PASSWORD))
    assert api_get(server, "0" * 40).status_code == 401
    assert api_get(server, "0" * 40).status_code == 401
    assert api_get(server, good).status_code == 200
    assert "login throttle: the cache failed, not counting" in server.log.read_text()


@pytest.mark.parametrize(
    "meta, trusted, counted",
    [
        # REMOTE_ADDR unless proxies are trusted, whatever X-Forwarded-For says
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "192.0.2.1"}, 0, "10.0.0.1"),
        # the entry the outermost trusted proxy appended; what the client sent is further left
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 192.0.2.1"}, 1, "192.0.2.1"),
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6,192.0.2.1,10.0.0.9"}, 2,
         "192.0.2.1"),
        # fewer entries than proxies: the request met only the inner ones
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "192.0.2.1"}, 2, "192.0.2.1"),
        # no header, or no address in it: the connection's own
        ({"REMOTE_ADDR": "10.0.0.1"}, 1, "10.0.0.1"),
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "unknown"}, 1, "10.0.0.1"),
        # with a port; IPv6 counted per /64 (one client holds all of it), IPv4-mapped as IPv4
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "192.0.2.1:5555"}, 1, "192.0.2.1"),
        ({"REMOTE_ADDR": "2001:db8:1:2:aaaa::1"}, 0, "2001:db8:1:2::/64"),
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "[2001:db8:1:2::ffff]:443"}, 1,
         "2001:db8:1:2::/64"),
        ({"REMOTE_ADDR": "::ffff:192.0.2.9"}, 0, "192.0.2.9"),
    ],
)  # fmt: skip
def test_the_client_address_counted(meta, trusted, counted):
    from ratejobs.login_throttle import client_address

    assert client_address(meta, trusted_proxies=trusted) == counted
