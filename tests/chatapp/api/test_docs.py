"""The OpenAPI schema and its docs page, which must work offline (no CDN)."""

from __future__ import annotations

import re

import httpx2 as httpx


def test_schema_and_offline_docs_page(api_server):
    schema = httpx.get(api_server.url + "/api/schema/", headers={"Accept": "application/json"})
    assert schema.status_code == 200
    doc = schema.json()
    assert doc["openapi"].startswith("3.")
    assert "/api/conversations/{conversation_id}/messages/" in doc["paths"]
    assert doc["components"]["securitySchemes"]["ApiKey"]["scheme"] == "bearer"

    page = httpx.get(api_server.url + "/api/docs/")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', page.text)
    assert assets, page.text[:500]
    for asset in assets:
        assert asset.startswith("/static/"), asset  # ours, not a CDN's
        assert httpx.get(api_server.url + asset).status_code == 200
