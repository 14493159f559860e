"""The limiter's keys in Redis after real work through REST: every key written has an expiry, and
a credential deleted through REST leaves no key of its bucket (docs/limiter.md, Q1 and T1). A
real Celery worker sends the calls to the sandbox; the limiter keys are read from Redis itself."""

from __future__ import annotations

from ratejobs.infra.connections import redis_client
from ratejobs.models import Job
from ratejobs.namespace import limiter_key_prefix
from ratejobs.services.apis import api_create
from tests.realparts import wait_for_job

# A cost window besides the rate, so the refund history is written too.
LIMITS = [{"rate": 1000, "period": 60, "burst": 1000, "unit": "cost"}]
CUSTOMERS = ("acme", "globex", "initech")


def _limiter_keys(api_name: str) -> dict[str, int]:
    """Every key of the API's limiters (its own and its credential keys'), with its PTTL."""
    client = redis_client()
    found = {}
    for pattern in (f"{limiter_key_prefix()}:{{{api_name}}}:*",
                    f"{limiter_key_prefix()}:{{{api_name}:*}}:*"):  # fmt: skip
        for key in client.scan_iter(match=pattern, count=1000):
            name = key.decode() if isinstance(key, bytes) else key
            found[name] = client.pttl(name)
    return found


def test_every_limiter_key_expires_and_a_deleted_credential_leaves_none(
    sandbox, shared_worker, client_for, manager, unique_name
):
    # given an API with a cost window and three customers' keys, added through REST
    server = sandbox(rate=1000, burst=100, headers="none")
    api = api_create(name=unique_name, base_url=server.url, rate=100, burst=10, limits=LIMITS)
    client = client_for(manager)
    added = client.post(
        f"/api/apis/{api.name}/credentials/",
        [{"key": key, "secret": f"Bearer {key}-secret"} for key in CUSTOMERS],
        format="json",
    )
    assert added.status_code == 201, added.content
    # when a job sends calls through each key and the API's own credential
    calls = [{"path": f"/items/{i}", "credential_key": key} for i, key in enumerate(CUSTOMERS)]
    created = client.post(
        "/api/jobs/",
        {"api": api.name, "name": "keys", "calls": [*calls, {"path": "/own"}]},
        format="json",
    )
    assert created.status_code == 201, created.content
    job = wait_for_job(Job.objects.get(pk=created.json()["id"]), timeout=60)
    assert job.succeeded == 4
    # expect: each bucket's keys are in Redis, and not one without an expiry
    keys = _limiter_keys(api.name)
    for bucket in (f"{{{api.name}}}", *(f"{{{api.name}:{key}}}" for key in CUSTOMERS)):
        assert any(bucket in key for key in keys), (bucket, sorted(keys))
    assert {key: ttl for key, ttl in keys.items() if ttl < 0} == {}
    # and a credential deleted through REST takes its bucket along, the others stay
    deleted = client.delete(f"/api/apis/{api.name}/credentials/globex/")
    assert deleted.status_code == 204
    left = _limiter_keys(api.name)
    assert [key for key in left if f"{{{api.name}:globex}}" in key] == []
    assert any(f"{{{api.name}:acme}}" in key for key in left)
