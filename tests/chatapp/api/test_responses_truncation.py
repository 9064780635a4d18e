"""/v1/responses chains longer than the context, on a live server whose model holds 512
tokens: `truncation: "disabled"` (the default) answers 400 context_length_exceeded once
the replayed chain no longer fits; "auto" cuts the oldest whole turns as chat completions
and the chat page do, and between cuts every turn still hits the cache."""

from __future__ import annotations

import openai
import pytest

from tests.chatapp.api.conftest import MODEL, Accounts
from tests.chatapp.e2e.conftest import start_live_server, stop_live_server

pytestmark = pytest.mark.model

CONTEXT = 512
BLOCK = 16
QUESTIONS = (
    "Which colour do you get when you mix blue and yellow paint together on a palette?",
    "Name one animal that lives in the sea and one that lives in the desert, please.",
    "What is the capital of France, and which river runs through the middle of it?",
    "How many legs does a spider have, compared with an ordinary insect like an ant?",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live, proc = start_live_server(
        tmp_path_factory.mktemp("responses-long"), "responses-long",
        LLM_MAX_MODEL_LEN=str(CONTEXT), API_DEFAULT_MAX_TOKENS="8",
        API_RATE_LIMIT_RPM="100000", LLM_PRELOAD="1")
    yield live
    stop_live_server(proc)


@pytest.fixture(scope="module")
def client(server):
    key = Accounts(server).user_with_key()[1]
    return openai.OpenAI(api_key=key, base_url=server.url + "/v1", max_retries=0, timeout=300)


def turn(client, n: int, previous, truncation: str):
    kwargs = {"previous_response_id": previous.id} if previous else {}
    return client.responses.create(model=MODEL, input=f"{n + 1}. {QUESTIONS[n % 4]}",
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
            assert previous.usage.input_tokens > CONTEXT // 2
            return
        assert previous.truncation == "disabled"
    pytest.fail("the chain never outgrew the context")


def test_truncation_auto_cuts_whole_turns_and_keeps_the_cache_between_cuts(client):
    previous, cuts = None, 0
    for n in range(24):
        done = turn(client, n, previous, "auto")
        assert done.truncation == "auto"
        usage = done.usage
        assert usage.input_tokens + 8 <= CONTEXT
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
