"""An API's More limits edited as rows: shown in their units, posted back unchanged without a new
limits version, errors naming the row, emptied rows meaning none, read-only in words."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from ratejobs.admin.window_rows import period_in_unit, row_from_window, window_rule_text
from ratejobs.models import Api
from tests.admin.test_api_page import change_url, form_data

HOURLY = {"rate": 1000, "period": 3600, "burst": 100, "unit": "requests"}
TOKENS = {"rate": 10000, "period": 60, "burst": 10000, "unit": "cost"}


class _FormFields(HTMLParser):
    """What a browser posts for the page's form `form_id`: its inputs, checked boxes and
    selected options (controls of other forms, form="...", left out)."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id, self.inside, self.select = form_id, False, None
        self.data: dict[str, list[str]] = {}
        self.first_option: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        if not self.inside or a.get("form") not in (None, self.form_id):
            return
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") not in ("checkbox", "radio") or "checked" in a:
                self.data.setdefault(name, []).append(a.get("value") or "")
        elif tag == "select":
            self.select = name
        elif tag == "option" and self.select:
            self.first_option.setdefault(self.select, a.get("value", ""))
            if "selected" in a:
                self.data[self.select] = [a.get("value", "")]

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select" and self.select:
            self.data.setdefault(self.select, [self.first_option.get(self.select, "")])
            self.select = None


def posted_as_shown(html: str) -> dict[str, list[str]]:
    parser = _FormFields("api_form")
    parser.feed(html)
    return parser.data


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(3600, ("1", "hours")), (90, ("90", "seconds")), (60.0, ("1", "minutes")),
     (172_800, ("2", "days")), (5400, ("90", "minutes")), (0.5, ("0.5", "seconds"))],
)  # fmt: skip
def test_a_period_is_shown_in_the_largest_unit_that_divides_it(seconds, shown):
    assert period_in_unit(seconds) == (float(shown[0]), shown[1])
    row = row_from_window({"rate": 5, "period": seconds, "burst": 1})
    assert (row.period, row.period_unit) == shown


def test_the_form_shows_a_row_per_window_in_its_units_and_two_empty_rows(root_client, make_api):
    api = make_api(limits=[HOURLY, TOKENS])
    form = posted_as_shown(root_client.get(change_url(api)).content.decode())
    rows = [
        tuple(form[f"limits-{i}-{name}"][0]
              for name in ("rate", "period", "period_unit", "burst", "unit"))
        for i in range(4)
    ]  # fmt: skip
    assert rows == [
        ("1000", "1", "hours", "100", "requests"),
        ("10000", "1", "minutes", "10000", "cost"),
        ("", "", "seconds", "", "requests"),
        ("", "", "seconds", "", "requests"),
    ]
    assert "limits-4-rate" not in form


def test_the_rows_never_outnumber_the_windows_an_api_may_have(root_client, make_api):
    api = make_api(limits=[{"rate": n, "period": 60, "burst": 1} for n in range(1, 8)])
    form = posted_as_shown(root_client.get(change_url(api)).content.decode())
    assert "limits-7-rate" in form and "limits-8-rate" not in form  # 7 windows, 1 empty row


def test_saving_the_page_as_shown_changes_neither_the_limits_nor_their_version(
    root_client, make_api
):
    # given an API whose windows are stored with whole numbers (3600, not 3600.0)
    api = make_api(limits=[HOURLY, TOKENS])
    stored, version = Api.objects.filter(pk=api.pk).values_list("limits", "limits_version").get()
    # when the page is posted back as the browser shows it
    data = posted_as_shown(root_client.get(change_url(api)).content.decode())
    response = root_client.post(change_url(api), data)
    assert response.status_code == 302, response.content.decode()[:3000]
    # expect: the same JSON, to its number types, and no new version for the limiter
    api.refresh_from_db()
    assert api.limits == stored and api.limits_version == version
    assert [type(w["period"]) for w in api.limits] == [int, int]


def test_rows_are_read_in_their_units_and_a_changed_row_is_a_new_version(root_client, make_api):
    api = make_api(limits=[HOURLY])
    rows = [
        {**HOURLY, "period": 2, "period_unit": "hours"},
        {"rate": 50, "period": 0.1, "period_unit": "minutes", "burst": 5},
        {"rate": 9000, "period": 1, "period_unit": "days", "burst": 900, "unit": "cost"},
    ]
    response = root_client.post(change_url(api), form_data(api, limits=rows))
    assert response.status_code == 302, response.content.decode()[:3000]
    api.refresh_from_db()
    assert api.limits == [
        {"rate": 1000, "period": 7200, "burst": 100, "unit": "requests"},
        {"rate": 50, "period": 6, "burst": 5, "unit": "requests"},  # not 6.000000000000001
        {"rate": 9000, "period": 86_400, "burst": 900, "unit": "cost"},
    ]
    assert api.limits_version == 2


def test_a_partly_filled_row_is_an_error_naming_the_row_and_nothing_is_saved(root_client, make_api):
    api = make_api(limits=[HOURLY])
    rows = [HOURLY, {"rate": 10, "period": 60}, {"rate": "ten", "period": 1, "burst": 1.5}]
    response = root_client.post(change_url(api), form_data(api, limits=rows))
    assert response.status_code == 200
    html = response.content.decode()
    assert "row 2: burst is required" in html
    assert "row 3: rate must be a number" in html and "row 3: burst must be a whole number" in html
    # and the rows come back as typed, for the user to correct
    assert 'name="limits-2-rate" id="id_limits-2-rate" value="ten"' in html
    api.refresh_from_db()
    assert api.limits == [HOURLY] and api.limits_version == 1


def test_the_limits_checks_name_the_row_on_the_page_once(root_client, make_api):
    # given a good row 1, an empty row 2 (ignored), a row 3 with a negative period and a row 4
    # that repeats row 1
    api = make_api()
    rows = [HOURLY, {}, {"rate": 10, "period": -5, "burst": 1}, HOURLY]
    response = root_client.post(change_url(api), form_data(api, limits=rows))
    assert response.status_code == 200
    html = response.content.decode()
    message = "row 3: period must be a positive number of seconds, at most 31,622,400"
    assert html.count(message) == 1
    assert html.count("row 4: the same rate, period and unit as row 1") == 1
    assert "limits[" not in html
    api.refresh_from_db()
    assert api.limits == []


def test_emptying_every_row_leaves_no_windows(root_client, make_api):
    api = make_api(limits=[HOURLY, TOKENS])
    response = root_client.post(change_url(api), form_data(api, limits=[{}, {}], cost_header=""))
    assert response.status_code == 302, response.content.decode()[:3000]
    api.refresh_from_db()
    assert api.limits == [] and api.limits_version == 2


def test_those_who_only_read_see_the_limits_in_words(admin_client_for, staff, make_api):
    api = make_api(limits=[HOURLY, TOKENS, {"rate": 5, "period": 90, "burst": 1}])
    html = admin_client_for(staff).get(change_url(api)).content.decode()
    assert "limits-0-rate" not in html
    assert (
        "1,000 requests per 1 hour, burst 100<br>10,000 cost units per 1 minute, burst 10,000"
        "<br>5 requests per 90 seconds, burst 1"
    ) in html
    assert window_rule_text({"rate": 0.5, "period": 1, "burst": 1}) == (
        "0.5 requests per 1 second, burst 1"
    )
