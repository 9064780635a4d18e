"""Acceptance 3: schemathesis generates requests from /api/schema/ and checks every answer:
no 5xx, and each response matches the schema (status, content type, body).

Driven through schemathesis' Python API (one Hypothesis run per operation) rather than
its pytest plugin, whose fixture loader does not work with this pytest version.
"""

from __future__ import annotations

import httpx2 as httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.model

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Invalid input (wrong types, missing fields, bad ids) must never cause a 5xx either, and
# whatever it gets back must still be a documented error body.
NEGATIVE_CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]
EXAMPLES = {GenerationMode.POSITIVE: 6, GenerationMode.NEGATIVE: 4}


def _run(operation, mode: GenerationMode, base_url: str, headers: dict, real_ids) -> None:
    checks = CHECKS if mode == GenerationMode.POSITIVE else NEGATIVE_CHECKS

    @given(case=operation.as_strategy(generation_mode=mode), real=st.booleans())
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case, real: bool) -> None:
        # Random ids only ever meet 404s: half the cases aim at a real conversation instead.
        params = case.path_parameters or {}
        if real and "conversation_id" in params:
            ids = real_ids(fresh=case.method.upper() == "DELETE")
            params["conversation_id"] = ids["conversation_id"]
            if "message_id" in params:
                params["message_id"] = ids["reply_id"]
            if isinstance(case.body, dict):
                case.body.pop("parent_id", None)  # continue after the current leaf
        # Replies generated here are short: the server runs with CHAT_MAX_NEW_TOKENS=8.
        case.call_and_validate(base_url=base_url, headers=headers, checks=checks, timeout=300)

    check()


def test_api_conforms_to_its_schema(api_server, accounts):
    schema = schemathesis.openapi.from_url(api_server.url + "/api/schema/")
    _, key = accounts.user_with_key()
    headers = {"Authorization": f"Bearer {key}"}
    api = httpx.Client(base_url=api_server.url + "/api", headers=headers, timeout=300)

    def conversation_with_a_turn() -> dict:
        cid = api.post("/conversations/", json={"title": "seed"}).json()["id"]
        turn = api.post(f"/conversations/{cid}/messages/", json={"content": "Hi"})
        assert turn.status_code == 201
        return {"conversation_id": cid, "reply_id": turn.json()["reply"]["id"]}

    kept = conversation_with_a_turn()

    def real_ids(fresh: bool) -> dict:
        if fresh:  # a DELETE gets its own, so the others keep theirs
            return {"conversation_id": api.post("/conversations/", json={}).json()["id"],
                    "reply_id": kept["reply_id"]}
        return kept

    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    failures = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        for operation in operations:
            try:
                _run(operation, mode, api_server.url, headers, real_ids)
            except Exception as exc:  # collect all, report together
                failures.append(f"{mode.value} {operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
