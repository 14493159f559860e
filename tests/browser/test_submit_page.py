"""The Submit a job page in a real browser: the calls of a chosen file and of the values box
are counted before anything is sent, and a file kept from a refused try is offered again."""

from __future__ import annotations

import pytest

from ratejobs.services.apis import api_create
from tests.browser.test_admin_in_browser import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_the_page_counts_the_calls_before_submitting_and_keeps_the_file(
    live_server, services_redis, unique_name, browser_page, screenshot
):
    api_create(name=unique_name, base_url="https://api.example.com", rate=10)
    page = browser_page
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/ratejobs/job/add/")
    count = page.locator("#calls-file-count")

    # a CSV of 1,204 calls, one with a line break inside quotes, and a blank row
    rows = "".join(f"/items/{i},\n" for i in range(1203)) + '/last,"two\nlines"\n\n'
    page.set_input_files("#id_calls_file", files=[
        {"name": "calls.csv", "mimeType": "text/csv", "buffer": f"path,body\n{rows}".encode()}
    ])  # fmt: skip
    page.wait_for_function("document.querySelector('#calls-file-count').textContent"
                           ".includes('calls')")  # fmt: skip
    assert count.text_content() == "calls.csv: 1,204 calls"
    # JSON lines, blank ones skipped
    jsonl = b'{"path": "/a"}\n\n{"path": "/b"}\n   \n{"path": "/c"}'
    page.set_input_files("#id_calls_file", files=[
        {"name": "calls.jsonl", "mimeType": "application/x-ndjson", "buffer": jsonl}
    ])  # fmt: skip
    page.wait_for_function("document.querySelector('#calls-file-count').textContent"
                           ".includes('calls.jsonl')")  # fmt: skip
    assert count.text_content() == "calls.jsonl: 3 calls"
    page.fill("#id_values", "1\n2\n\n3\n")
    assert page.locator("#values-count").text_content() == "3 calls"
    page.fill("#id_values", "")

    # a try refused (no name) comes back with the file offered from the last try
    page.select_option("#id_api", label=unique_name)
    page.click("input[name=_save]")
    kept = page.locator("#kept-upload")
    shown = kept.text_content().replace("\xa0", " ")
    assert f"Using calls.jsonl ({len(jsonl)} bytes) from your last try" in shown
    screenshot(page, "submit-page-kept-file")
    page.fill("#id_name", "from the kept file")
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/ratejobs/job/*/change/")
    assert "submitted with 3 calls" in page.content()
