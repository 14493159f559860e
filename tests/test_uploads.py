"""Reading uploaded files of calls: formats, line numbers in errors, and streaming."""

from __future__ import annotations

import io

import pytest

from ratejobs import uploads
from ratejobs.models import Call, Job
from ratejobs.uploads import (
    MAX_ERRORS_SHOWN,
    MAX_LINE_BYTES,
    LineError,
    UploadError,
    UploadErrors,
    calls_from_csv,
    calls_from_jsonl,
    calls_from_template,
    calls_from_upload,
    job_submit_from_file,
)


def jsonl(text: str) -> list[dict]:
    return list(calls_from_jsonl(io.BytesIO(text.encode())))


def csv_calls(text: str) -> list[dict]:
    return list(calls_from_csv(io.BytesIO(text.encode())))


def test_jsonl_reads_one_call_per_line_skipping_blank_lines_and_a_bom():
    data = '\ufeff{"path": "/a"}\n\n  \n{"method": "POST", "path": "/b", "json": [1]}\n'
    assert jsonl(data) == [{"path": "/a"}, {"method": "POST", "path": "/b", "json": [1]}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"path": "/a"}\n{"path": \n', "line 2: not valid JSON"),
        ('{"path": "/a"}\n\n[1, 2]\n', "line 3: each line must be a JSON object"),
    ],
)
def test_jsonl_errors_name_the_line(text, message):
    with pytest.raises(UploadError, match=message):
        jsonl(text)


def test_non_utf8_bytes_are_refused_with_their_line():
    with pytest.raises(UploadError, match="line 2: not UTF-8"):
        list(calls_from_jsonl(io.BytesIO(b'{"path": "/a"}\n{"path": "\xff"}\n')))
    with pytest.raises(UploadError, match="not UTF-8"):
        list(calls_from_csv(io.BytesIO(b"path\n/\xff\n")))


def test_csv_reads_every_column_with_query_as_json_or_query_string():
    data = (
        "Method, PATH ,query,headers,json,body\n"
        'POST,/items,"{""a"": 1}","{""X-T"": ""t""}","{""n"": 2}",\n'
        "GET,/search,q=x&tag=a&tag=b,,,\n"
        ",/plain,,,,raw text\n"
    )
    assert csv_calls(data) == [
        {
            "method": "POST",
            "path": "/items",
            "query": {"a": 1},
            "headers": {"X-T": "t"},
            "json": {"n": 2},
        },
        {"method": "GET", "path": "/search", "query": {"q": "x", "tag": ["a", "b"]}},
        {"path": "/plain", "body": "raw text"},
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("path,colour\n/a,red\n", "line 1: unknown columns: colour"),
        ("method\nGET\n", "line 1: a path column is needed"),
        ("", "line 1: the file is empty"),
        ('path,json\n"/a\nb",{}\n/c,{bad\n', "line 4: column json: not valid JSON"),
        ("path\n/a,/b\n", "line 2: 2 cells for 1 columns"),
    ],
)
def test_csv_errors_name_the_line_and_column(text, message):
    with pytest.raises(UploadError, match=message):
        csv_calls(text)


def test_a_template_fills_its_one_placeholder_with_each_value_quoted():
    calls = list(
        calls_from_template(
            method="DELETE", path_template="/users/{id}", values=["1", "", " a/b?c "]
        )
    )
    assert calls == [
        {"method": "DELETE", "path": "/users/1"},
        {"method": "DELETE", "path": "/users/a%2Fb%3Fc"},
    ]


@pytest.mark.parametrize("template", ["/users", "/u/{a}/{b}", "/u/{0}", "/u/{id"])
def test_a_template_needs_exactly_one_named_placeholder(template):
    with pytest.raises(UploadError, match="exactly one placeholder"):
        list(calls_from_template(method="GET", path_template=template, values=["1"]))


def test_the_reader_is_chosen_by_extension():
    assert list(calls_from_upload("Calls.JSONL", io.BytesIO(b'{"path": "/a"}'))) == [{"path": "/a"}]
    assert list(calls_from_upload("x.ndjson", io.BytesIO(b'{"path": "/a"}'))) == [{"path": "/a"}]
    assert list(calls_from_upload("x.csv", io.BytesIO(b"path\n/a\n"))) == [{"path": "/a"}]
    with pytest.raises(UploadError, match="unsupported file type"):
        calls_from_upload("x.xlsx", io.BytesIO(b""))


class CountingLines(io.RawIOBase):
    """A large file made on demand, counting the bytes it has handed out."""

    def __init__(self, lines: int, line: bytes) -> None:
        self.remaining, self.line, self.pending, self.bytes_read = lines, line, b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while len(self.pending) < len(buffer) and self.remaining:
            self.pending += self.line
            self.remaining -= 1
        chunk, self.pending = self.pending[: len(buffer)], self.pending[len(buffer) :]
        buffer[: len(chunk)] = chunk
        self.bytes_read += len(chunk)
        return len(chunk)


@pytest.mark.parametrize(
    ("reader", "header", "line"),
    [
        (calls_from_jsonl, b"", b'{"path": "/items/1"}\n'),
        (calls_from_csv, b"path\n", b"/items/1\n"),
    ],
)
def test_files_are_read_as_a_stream(reader, header, line):
    source = CountingLines(100_000, line)
    source.pending = header
    calls = reader(io.BufferedReader(source))
    assert next(calls) == {"path": "/items/1"}
    assert source.bytes_read < 100_000 * len(line) / 10


def test_a_line_without_end_is_cut_off_at_the_limit():
    source = CountingLines(1, b"x" * (5 * 1024 * 1024))
    with pytest.raises(UploadError, match="line 1: longer than"):
        list(calls_from_jsonl(io.BufferedReader(source)))


def test_each_call_remembers_the_line_it_came_from():
    calls = calls_from_jsonl(io.BytesIO(b'{"path": "/a"}\n\n{"path": "/b"}\n{"path": "/c"}\n'))
    assert [spec["path"] for spec in calls] == ["/a", "/b", "/c"]
    assert [calls.line_of(i) for i in range(4)] == [1, 3, 4, None]


def test_reading_goes_on_past_bad_lines_and_names_them_all_at_the_end():
    # given JSON lines with three unreadable ones among good calls
    calls = calls_from_jsonl(io.BytesIO(b'{"path": "/a"}\n{oops\n[1]\n{"path": "/b"}\n\xff\n'))
    with pytest.raises(UploadErrors) as raised:
        list(calls)
    assert raised.value.messages() == [
        "line 2: not valid JSON: Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)",
        "line 3: each line must be a JSON object (a call)",
        "line 5: not UTF-8 text",
    ]
    assert [calls.line_of(i) for i in range(2)] == [1, 4]  # the good calls keep their lines


def test_a_too_long_line_is_skipped_to_its_end_and_the_next_line_read():
    source = io.BytesIO(b"x" * (MAX_LINE_BYTES + 10) + b'\n{"path": "/b"}\n{bad\n')
    with pytest.raises(UploadErrors) as raised:
        list(calls_from_jsonl(source))
    assert [error.line for error in raised.value.errors] == [1, 3]


def test_a_csv_reader_goes_on_past_bad_rows():
    data = 'path,json\n/a,{bad\n/b,1,2\n/c,"{""k"": 1}"\n'
    with pytest.raises(UploadErrors) as raised:
        csv_calls(data)
    assert raised.value.messages() == [
        "line 2: column json: not valid JSON: Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)",
        "line 3: 3 cells for 2 columns",
    ]


def test_errors_past_the_cap_are_counted_in_one_line():
    errors = [LineError(n, "__all__", "bad") for n in range(1, MAX_ERRORS_SHOWN + 1)]
    assert UploadErrors(errors, MAX_ERRORS_SHOWN + 1, exact=True).messages()[-1] == (
        "and 1 more error"
    )
    assert UploadErrors(errors, 1234 + MAX_ERRORS_SHOWN, exact=True).messages()[-1] == (
        "and 1,234 more errors"
    )
    assert UploadErrors(errors, 1 + MAX_ERRORS_SHOWN, exact=False).messages()[-1] == (
        "and at least 1 more error"
    )
    assert UploadErrors(errors[:2], 2, exact=True).messages() == ["line 1: bad", "line 2: bad"]


@pytest.mark.usefixtures("services_redis")
def test_a_huge_file_counts_its_errors_only_so_far(api, user, monkeypatch):
    # given a file whose calls are all bad, longer than the count after a refusal may read
    monkeypatch.setattr(uploads, "MAX_LINES_READ_AFTER_AN_ERROR", 50)
    lines = b"".join(b'{"path": "/../x"}\n' for _ in range(200))
    with pytest.raises(UploadErrors) as raised:
        job_submit_from_file(calls=calls_from_jsonl(io.BytesIO(lines)), api=api, owner=user,
                             name="huge")  # fmt: skip
    # expect: the 20 the job service checked and the 50 read after them, as a minimum
    assert (raised.value.total, raised.value.exact) == (70, False)
    assert raised.value.messages()[-1] == "and at least 50 more errors"
    assert not Job.objects.exists()


@pytest.mark.usefixtures("services_redis")
def test_good_calls_among_bad_lines_are_not_stored(api, user):
    lines = b'{"path": "/a"}\n{oops\n{"path": "/b"}\n'
    with pytest.raises(UploadErrors, match="line 2: not valid JSON"):
        job_submit_from_file(calls=calls_from_jsonl(io.BytesIO(lines)), api=api, owner=user,
                             name="partly bad")  # fmt: skip
    assert (Job.objects.count(), Call.objects.count()) == (0, 0)
