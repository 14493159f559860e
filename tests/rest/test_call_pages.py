"""A page of calls carries response bodies up to RATEJOBS_MAX_PAGE_BYTES in all, loaded only
within that budget; the rest are flagged and read one call at a time."""

from __future__ import annotations

import base64

from ratejobs.models import Call


def give_bodies(job, bodies: dict[int, bytes]) -> None:
    for index, body in bodies.items():
        Call.objects.filter(job=job, index=index).update(
            status=Call.Status.SUCCEEDED, status_code=200, response_body=body
        )


def test_bodies_fill_the_page_in_index_order_until_its_budget(
    api_client, make_job, settings, django_assert_max_num_queries
):
    settings.RATEJOBS_MAX_PAGE_BYTES = 250
    job = make_job(calls=5)
    give_bodies(job, {0: b"a" * 100, 1: b"b" * 100, 2: b"c" * 100, 3: b"d" * 10})

    with django_assert_max_num_queries(6):  # bodies in one query, never one per call
        results = api_client.get(f"/api/jobs/{job.pk}/calls/").json()["results"]

    shown = [(c["response_body"], c["response_body_omitted"]) for c in results]
    assert shown == [
        ("a" * 100, False),
        ("b" * 100, False),
        (None, True),  # would pass 250 bytes
        (None, True),  # small enough, but after the first left out: the page is a prefix
        (None, False),  # no response yet
    ]


def test_one_call_comes_with_its_whole_body(api_client, make_job, settings, client_for, other_user):
    settings.RATEJOBS_MAX_PAGE_BYTES = 10
    job = make_job(calls=2)
    give_bodies(job, {1: b"\xff\xfe" * 60})

    call = api_client.get(f"/api/jobs/{job.pk}/calls/1/").json()
    assert (call["index"], call["response_body_base64"], call["response_body_omitted"]) == (
        1,
        True,
        False,
    )
    assert base64.b64decode(call["response_body"]) == b"\xff\xfe" * 60  # over the page budget
    assert api_client.get(f"/api/jobs/{job.pk}/calls/2/").status_code == 404
    assert client_for(other_user).get(f"/api/jobs/{job.pk}/calls/1/").status_code == 404


def test_the_budget_counts_bytes_not_characters(api_client, make_job, settings):
    # 50 characters of 2 bytes each: the database's length of the stored bytes is 100
    settings.RATEJOBS_MAX_PAGE_BYTES = 150
    job = make_job(calls=2)
    give_bodies(job, {0: "é".encode() * 50, 1: "é".encode() * 50})
    results = api_client.get(f"/api/jobs/{job.pk}/calls/").json()["results"]
    assert [c["response_body_omitted"] for c in results] == [False, True]
    assert results[0]["response_body"] == "é" * 50


def test_the_schema_documents_the_flag_and_the_one_call_route(client_for):
    schema = client_for(None).get("/api/schema/?format=json").json()
    assert "/api/jobs/{job_id}/calls/{index}/" in schema["paths"]
    call = schema["components"]["schemas"]["CallOutput"]["properties"]
    assert call["response_body_omitted"]["type"] == "boolean"
    assert "RATEJOBS_MAX_PAGE_BYTES" in call["response_body_omitted"]["description"]
