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


def _schema(client_for) -> dict:
    return client_for(None).get("/api/schema/?format=json").json()


def _operations(schema: dict):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            yield f"{method.upper()} {path}", operation


def test_every_operation_lists_the_errors_it_can_answer_with_the_error_body(client_for):
    schema = _schema(client_for)
    responses = {name: set(op["responses"]) for name, op in _operations(schema)}
    assert {"400", "401", "403", "413", "415", "429"} <= responses["POST /api/jobs/"]
    assert {"401", "404"} <= responses["GET /api/jobs/{job_id}/"]
    assert {"400", "401", "403", "404", "413", "415"} <= responses["PATCH /api/apis/{name}/"]
    assert {"401", "403", "404", "409"} <= responses["POST /api/jobs/{job_id}/pause/"]
    assert {"400", "404"} <= responses["GET /api/jobs/{job_id}/calls/"]  # filters, pages
    assert responses["GET /api/"] == {"200"}  # public
    for name, operation in _operations(schema):
        for status, response in operation["responses"].items():
            if status.startswith("4"):
                assert response["content"], (name, status)


def _numbers(schema: dict, where: str):
    """(where, property) of every number or integer in a schema object, nested ones too."""
    for name, prop in schema.get("properties", {}).items():
        if prop.get("type") in ("number", "integer"):
            yield f"{where}.{name}", prop
        yield from _numbers(prop, f"{where}.{name}")


def test_request_bodies_refuse_unknown_fields_and_bound_every_number(client_for):
    schema = _schema(client_for)
    components = schema["components"]["schemas"]
    for name in ("ApiCreateInput", "PatchedApiUpdateInput", "JobCreateInput", "CallSpec"):
        assert components[name]["additionalProperties"] is False, name
        for where, prop in _numbers(components[name], name):
            assert {"minimum", "maximum"} <= set(prop), where
    assert components["JobCreateInput"]["properties"]["calls"]["minItems"] == 1


def test_names_and_keys_have_the_patterns_the_server_checks(client_for):
    schema = _schema(client_for)
    slug = "^[-a-zA-Z0-9_]+$"
    api_detail = schema["paths"]["/api/apis/{name}/"]["get"]["parameters"]
    assert [p["schema"]["pattern"] for p in api_detail if p["name"] == "name"] == [slug]
    api_name = schema["components"]["schemas"]["ApiCreateInput"]["properties"]["name"]
    assert api_name["pattern"] == slug
    key = schema["paths"]["/api/jobs/"]["post"]["parameters"]
    assert [p["schema"]["pattern"] for p in key if p["name"] == "Idempotency-Key"] == [
        r"^[\x21-\x7e]{1,200}$"
    ]
