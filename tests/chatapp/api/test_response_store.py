"""Stored /v1/responses responses in the database: a chain replays oldest first, only
within its user's rows; a deleted response breaks the chains that continue it."""

from __future__ import annotations

import pytest

from chatapp.api import response_store
from chatapp.api.v1.responses import ChainIds, reply_key
from chatapp.api.v1.tool_params import calls_key

pytestmark = pytest.mark.django_db


def _store(user, rid: str, previous: str | None, text: str, ids: list[int]) -> None:
    response_store.response_store(
        user=user, response_id=rid, previous_response_id=previous,
        input_messages=[{"role": "user", "content": f"question {rid}"}],
        output_message={"role": "assistant", "content": text}, output_ids=ids,
        body={"id": rid, "object": "response"}, model="smollm2")


def test_a_chain_replays_oldest_first_for_its_user_only(django_user_model):
    alice = django_user_model.objects.create_user("alice-responses")
    bob = django_user_model.objects.create_user("bob-responses")
    _store(alice, "resp_1", None, "one", [1, 2])
    _store(alice, "resp_2", "resp_1", "two", [3])
    _store(alice, "resp_3", "resp_2", "three", [4, 5, 6])
    chain = response_store.response_chain(user=alice, response_id="resp_3")
    assert [t.id for t in chain] == ["resp_1", "resp_2", "resp_3"]
    assert [t.output_ids for t in chain] == [[1, 2], [3], [4, 5, 6]]
    assert chain[0].input_messages == [{"role": "user", "content": "question resp_1"}]
    assert response_store.response_body(user=alice, response_id="resp_2")["id"] == "resp_2"

    # Bob sees none of it, exactly as if it did not exist.
    with pytest.raises(LookupError):
        response_store.response_chain(user=bob, response_id="resp_3")
    assert response_store.response_body(user=bob, response_id="resp_3") is None
    assert response_store.response_delete(user=bob, response_id="resp_3") is False

    assert response_store.response_delete(user=alice, response_id="resp_2") is True
    assert response_store.response_body(user=alice, response_id="resp_2") is None
    with pytest.raises(response_store.ChainBroken) as exc:
        response_store.response_chain(user=alice, response_id="resp_3")
    assert exc.value.missing == "resp_2"
    # The response before the deleted one still continues.
    assert len(response_store.response_chain(user=alice, response_id="resp_1")) == 1


def test_chain_ids_hand_each_reply_its_own_ids_in_order():
    turns = [
        response_store.Turn("a", [], {"role": "assistant", "content": "Same."}, [1, 2]),
        response_store.Turn("b", [], {"role": "assistant", "content": "Same."}, [1, 3]),
        response_store.Turn("c", [], {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]}, [7, 8]),
    ]
    known = ChainIds(turns, "")
    assert reply_key(turns[2].output_message) == calls_key(["call_1"])
    assert known(calls_key(["call_1"])) == [7, 8]
    assert known("Same.") == [1, 2]
    assert known("Same.") == [1, 3]
    assert known("Same.") is None  # a client's own assistant text: encoded afresh


def test_another_models_replies_are_encoded_from_their_text():
    turn = response_store.Turn("a", [], {"role": "assistant", "content": "Hi."}, [1, 2],
                               model="gemma")
    assert ChainIds([turn], "smollm2")("Hi.") is None
    assert ChainIds([turn], "gemma")("Hi.") == [1, 2]
