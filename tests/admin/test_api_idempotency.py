"""The API form's idempotency header: set and cleared there, refused on the form when it clashes."""

from __future__ import annotations

from ratejobs.models import Api
from tests.admin.test_api_page import change_url, form_data


def test_the_api_form_sets_and_clears_the_idempotency_header(root_client, api):
    assert 'name="idempotency_header"' in root_client.get(change_url(api)).content.decode()
    response = root_client.post(change_url(api), form_data(api, idempotency_header="Idem-Key"))
    assert response.status_code == 302, response.content.decode()[:2000]
    api.refresh_from_db()
    assert api.idempotency_header == "Idem-Key"
    root_client.post(change_url(api), form_data(api, idempotency_header=""))
    assert Api.objects.get(pk=api.pk).idempotency_header == ""


def test_a_clashing_idempotency_header_is_shown_on_the_form_and_nothing_changes(root_client, api):
    data = form_data(api, auth_header="X-Key", idempotency_header="x-key")
    response = root_client.post(change_url(api), data)
    html = response.content.decode()
    assert response.status_code == 200
    assert "errornote" in html and "that is the auth_header" in html
    stored = Api.objects.get(pk=api.pk)
    assert (stored.auth_header, stored.idempotency_header) == ("Authorization", "")
