"""The OpenAPI schema and the Swagger UI, served without a CDN."""

from __future__ import annotations


def test_schema_is_an_openapi_document_with_the_job_paths(client_for):
    response = client_for(None).get("/api/schema/?format=json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path in (
        "/api/jobs/",
        "/api/jobs/{job_id}/",
        "/api/jobs/{job_id}/calls/",
        "/api/jobs/{job_id}/retry-failed/",
        "/api/apis/{name}/",
    ):
        assert path in schema["paths"], path
    assert "tokenAuth" in schema["components"]["securitySchemes"]


def test_swagger_ui_is_html_from_our_own_static_files(client_for):
    response = client_for(None).get("/api/docs/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html
