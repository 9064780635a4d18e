"""/v1/responses chains longer than the context, on a live server whose model holds 512
tokens: `truncation: "disabled"` (the default) answers 400 context_length_exceeded once
the replayed chain no longer fits; "auto" cuts the oldest whole turns as chat completions
and the chat page do, and between cuts every turn still hits the cache."""

from __future__ import annotations

import openai
import pytest

from tests.chatapp.api.conftest import MODEL, SHORT_CONTEXT, Accounts, question

pytestmark = pytest.mark.model

BLOCK = 16


@pytest.fixture(scope="module")
def client(short_context_server):
    key = Accounts(short_context_server).user_with_key()[1]
    return openai.OpenAI(api_key=key, base_url=short_context_server.url + "/v1", max_retries=0, timeout=300)


def turn(client, n: int, previous, truncation: str):
    kwargs = {"previous_response_id": previous.id} if previous else {}
    return client.responses.create(model=MODEL, input=question(n),
                                   max_output_tokens=8, temperature=0, truncation=truncation,
                                   **kwargs)


def test_a_chain_past_the_context_is_refused_by_default(client):
    previous = None
    for n in range(40):
        try:
            previous = turn(client, n, previous, "disabled")
        except openai.BadRequestError as exc:
            assert exc.code == "context_length_exceeded"
            assert exc.param == "input"
            assert previous.usage.input_tokens > SHORT_CONTEXT // 2
            return
        assert previous.truncation == "disabled"
    pytest.fail("the chain never outgrew the context")


def test_truncation_auto_cuts_whole_turns_and_keeps_the_cache_between_cuts(client):
    previous, cuts = None, 0
    for n in range(24):
        done = turn(client, n, previous, "auto")
        assert done.truncation == "auto"
        usage = done.usage
        assert usage.input_tokens + 8 <= SHORT_CONTEXT
        if previous is not None:
            before = previous.usage
            if usage.input_tokens > before.input_tokens + before.output_tokens:
                # No cut: the prompt extends the previous one, which the cache serves
                # (all of it but the reply's last token, never run through the model).
                computed = before.input_tokens + before.output_tokens - 1
                assert usage.input_tokens_details.cached_tokens >= computed // BLOCK * BLOCK
            else:
                cuts += 1
        previous = done
    assert cuts >= 1
