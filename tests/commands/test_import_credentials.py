"""`import_credentials` (secrets from a file, all or nothing), `limiter_status` naming the key
buckets, `submit_job --credential-key`, and the key-bucket gauge of /metrics."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from ratejobs.crypto import decrypt_secret
from ratejobs.infra.limiters import api_limiter
from ratejobs.models import ApiCredential, Job

pytestmark = pytest.mark.usefixtures("services_redis")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_credentials_are_imported_from_csv_and_jsonl_and_a_bad_file_stores_nothing(api, tmp_path):
    csv_file = tmp_path / "creds.csv"
    csv_file.write_text("key,secret\nacme,Bearer a\nglobex,Bearer g\n")
    assert "2 credentials stored" in run("import_credentials", "--api", api.name,
                                         "--file", str(csv_file))  # fmt: skip
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text(json.dumps({"key": "acme", "secret": "Bearer a2"}) + "\n")
    with pytest.raises(CommandError, match="exist already"):
        run("import_credentials", "--api", api.name, "--file", str(jsonl))
    run("import_credentials", "--api", api.name, "--file", str(jsonl), "--replace")
    stored = ApiCredential.objects.get(api=api, key="acme")
    assert decrypt_secret(stored.credential_encrypted) == "Bearer a2"
    bad = tmp_path / "bad.csv"
    bad.write_text("key,secret\nnew-one,x\nbad:key,Bearer leaked\n")
    with pytest.raises(CommandError, match="nothing was stored") as raised:
        run("import_credentials", "--api", api.name, "--file", str(bad))
    assert "leaked" not in str(raised.value)
    assert sorted(ApiCredential.objects.values_list("key", flat=True)) == ["acme", "globex"]


def test_limiter_status_counts_key_buckets_and_names_the_most_throttled(api):
    api_limiter(api, "acme").acquire(max_wait=1)
    api_limiter(api, "globex").block(20)
    text = run("limiter_status", api.name)
    assert "credential keys with live buckets: 2; most throttled: globex (blocked" in text
    (state,) = json.loads(run("limiter_status", api.name, "--json"))
    assert state["key_buckets"]["live"] == 2
    assert [b["key"] for b in state["key_buckets"]["top"]] == ["globex"]


def test_submit_job_takes_a_credential_key(api, superuser, tmp_path):
    run("import_credentials", "--api", api.name, "--file", _file(tmp_path, "acme"))
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n{"path": "/b", "credential_key": "acme"}\n')
    run("submit_job", "--api", api.name, "--file", str(calls), "--credential-key", "acme")
    assert Job.objects.get().credential_key == "acme"
    with pytest.raises(CommandError, match="ghost"):
        run("submit_job", "--api", api.name, "--file", str(calls), "--credential-key", "ghost")


def test_metrics_give_one_gauge_of_live_key_buckets_per_api(client, api, settings):
    settings.RATEJOBS_METRICS_PUBLIC = True
    run("import_credentials", "--api", api.name, "--file", _file_at(api, "acme"))
    for key in ("acme", "globex", "initech"):
        api_limiter(api, key).acquire(max_wait=1)
    text = client.get("/metrics").content.decode()
    assert f'ratejobs_limiter_key_buckets{{api="{api.name}"}} 3.0' in text
    assert "acme" not in text  # no label per key


def _file(tmp_path, key: str) -> str:
    path = tmp_path / f"{key}.csv"
    path.write_text(f"key,secret\n{key},Bearer {key}\n")
    return str(path)


def _file_at(api, key: str) -> str:
    import tempfile
    from pathlib import Path

    return _file(Path(tempfile.mkdtemp()), key)
