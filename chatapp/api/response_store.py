"""Reads and writes of stored /v1/responses responses, always within one user's rows: an
id of another user's response is answered exactly as an id that never existed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser

from chatapp.api.models import StoredResponse


class ChainBroken(Exception):
    """A response in the chain was deleted (or never stored): it cannot be replayed."""

    def __init__(self, missing: str):
        super().__init__(missing)
        self.missing = missing


@dataclass(frozen=True)
class Turn:
    """One stored response as the next prompt replays it."""

    id: str
    input_messages: list[dict]
    output_message: dict
    output_ids: list[int]
    model: str = ""  # the served model whose tokenizer the ids are of


def response_body(*, user: AbstractBaseUser, response_id: str) -> dict | None:
    """The stored Response object, or None (unknown, deleted, or another user's)."""
    row = StoredResponse.objects.filter(user=user, pk=response_id).values_list("body", flat=True)
    return row.first()


def response_chain(*, user: AbstractBaseUser, response_id: str) -> list[Turn]:
    """The turns from the first response of the chain to `response_id`, oldest first.

    LookupError when `response_id` itself is not this user's; ChainBroken when an
    earlier response it continues is gone."""
    turns: list[Turn] = []
    seen: set[str] = set()
    wanted = response_id
    while wanted:
        if wanted in seen:  # ids are ours and never reused, but a loop must not hang
            raise ChainBroken(wanted)
        seen.add(wanted)
        row = StoredResponse.objects.filter(user=user, pk=wanted).values_list(
            "previous_response_id", "input_messages", "output_message", "output_ids",
            "model").first()
        if row is None:
            if wanted == response_id:
                raise LookupError(response_id)
            raise ChainBroken(wanted)
        previous, messages, output, ids, model = row
        turns.append(Turn(wanted, messages, output, ids, model))
        wanted = previous
    turns.reverse()
    return turns


def response_store(*, user: AbstractBaseUser, response_id: str, previous_response_id: str | None,
                   input_messages: Sequence[dict], output_message: dict,
                   output_ids: Sequence[int], body: dict, model: str) -> StoredResponse:
    return StoredResponse.objects.create(
        id=response_id, user=user, previous_response_id=previous_response_id or "", model=model,
        input_messages=list(input_messages), output_message=output_message,
        output_ids=list(output_ids), body=body,
    )


def response_delete(*, user: AbstractBaseUser, response_id: str) -> bool:
    """Delete the user's response; False when there was none to delete."""
    deleted, _ = StoredResponse.objects.filter(user=user, pk=response_id).delete()
    return deleted > 0
