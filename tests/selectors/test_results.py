"""Reading a job's results in pages (ratejobs.selectors.results): keyset pages bounded by the
bytes of their bodies, and nothing held open between them, so a slow reader of a million-call
download costs the database nothing while it reads. The files built from these rows are tested
through REST (tests/rest/test_results.py)."""

from __future__ import annotations

import contextlib

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from psycopg import pq

from ratejobs.models import Call
from ratejobs.selectors import results
from tests.rest.test_results import COLUMNS

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("services_redis")]


def test_a_page_holds_the_budget_and_one_body_more_at_most(make_job, monkeypatch):
    # given: a budget of 1,000 bytes; bodies of 300, 300, 300, 300 (the 4th crosses it), 50,
    # 5,000 (alone more than the budget), then 10 calls without one
    monkeypatch.setattr(results, "PAGE_BUDGET_BYTES", 1000)
    job = make_job(calls=16)
    sizes = [300, 300, 300, 300, 50, 5000]
    for index, size in enumerate(sizes):
        Call.objects.filter(job=job, index=index).update(response_body=b"b" * size)
    # expect: a page ends with the body that crosses the budget (1,200 bytes, then 5,050: at
    # most the budget and one body), and the bodies after it are read by the next one, which
    # asks for twice the calls the one before kept (8, then 4, then 8)
    read: list[tuple[int, int]] = []  # (index, statements run when it came)
    with CaptureQueriesContext(connection) as queries:
        for row in results.call_result_rows(job):
            read.append((row[0], len(queries)))
    assert [index for index, _ in read] == list(range(16))
    assert [statements for _, statements in read] == [1] * 4 + [2] * 2 + [3] * 4 + [4] * 6
    bodies = [
        dict(zip(COLUMNS, row, strict=True))["response_body"]
        for row in results.call_result_rows(job)
    ]
    assert [len(body or "") for body in bodies] == sizes + [0] * 10


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql  # pg_cursors, and the session's transaction status
def test_between_pages_the_connection_holds_no_transaction_and_no_cursor(make_job, monkeypatch):
    # given: autocommit, as in a web request, and pages of 16 rows
    monkeypatch.setattr(results, "PAGE_ROWS", 16)
    job = make_job(calls=40)
    with contextlib.closing(results.call_result_rows(job)) as rows:
        for index in range(40):
            # expect: while the caller holds a row (a client reading slowly), nothing is open
            assert next(rows)[0] == index
            assert not connection.in_atomic_block
            assert connection.connection.info.transaction_status == pq.TransactionStatus.IDLE
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_cursors")
                assert cursor.fetchone() == (0,)
        assert next(rows, None) is None
