"""Acceptance 1: the official `openai` package against the live server and the real model."""

from __future__ import annotations

import uuid

import pytest

from tests.chatapp.api.conftest import MODEL

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def client(accounts, client_for):
    _, key = accounts.user_with_key()
    return client_for(key)


def test_non_streaming_completion_and_stop(client):
    done = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, temperature=0
    )
    assert done.object == "chat.completion"
    assert done.id.startswith("chatcmpl-")
    assert done.model == MODEL
    [choice] = done.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    text = choice.message.content
    assert isinstance(text, str) and text
    assert choice.finish_reason in ("stop", "length")
    usage = done.usage
    assert usage.completion_tokens >= 1
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens is not None

    # Greedy decoding repeats itself: stopping at a later word cuts the same text there.
    words = text.split()
    assert len(words) >= 2, text
    stop_word = words[1]
    cut = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, stop=[stop_word, "zzzq"]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop_word)]
    assert stop_word not in cut.choices[0].message.content


def test_streaming_completion_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    content_chunks = [c for c in chunks if c.choices]
    # The first chunk is the first token: it carries the role and the first text.
    first = content_chunks[0].choices[0]
    assert first.delta.role == "assistant" and first.delta.content
    assert [c.choices[0].finish_reason for c in content_chunks][-1] in ("stop", "length")
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text
    # include_usage: one last chunk, no choices, the usage; the others carry none.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert 1 <= usage.completion_tokens <= 8
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_two_choices(client):
    done = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=1.0, seed=7, n=2
    )
    assert sorted(c.index for c in done.choices) == [0, 1]
    assert all(c.message.content is not None for c in done.choices)
    # The prompt counts once; completion tokens add up over both choices.
    assert 2 <= done.usage.completion_tokens <= 12

    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=4, n=2, stream=True
    )
    finished = {c.choices[0].index: c.choices[0].finish_reason
                for c in stream if c.choices and c.choices[0].finish_reason}
    assert set(finished) == {0, 1}


def _system_prompt(rules: int = 24) -> str:
    # ~400 tokens of plain instructions; the nonce keeps this run's blocks its own.
    rules = [
        f"Rule {i}: answer politely, stay on topic, and cite the handbook section {i}."
        for i in range(1, rules + 1)
    ]
    return f"Support desk {uuid.uuid4().hex[:8]}. " + " ".join(rules)


def test_prefix_cache_hits_and_tenant_isolation(accounts, client_for, client):
    system = {"role": "system", "content": _system_prompt()}
    first_turn = [system, {"role": "user", "content": "How do I reset my password?"}]

    one = client.chat.completions.create(model=MODEL, messages=first_turn, max_tokens=8,
                                         temperature=0)
    prompt_tokens = one.usage.prompt_tokens
    assert prompt_tokens >= 400
    # The block-aligned system segment is computed once, then served from the cache.
    two = client.chat.completions.create(model=MODEL, messages=first_turn, max_tokens=8,
                                         temperature=0)
    assert two.usage.prompt_tokens == prompt_tokens
    assert two.usage.prompt_tokens_details.cached_tokens >= 384

    # Continuing the conversation: the reply comes back as text and is spliced back as the
    # ids generated for it, so the cache covers the whole earlier exchange.
    reply = two.choices[0].message.content
    three = client.chat.completions.create(
        model=MODEL,
        messages=first_turn + [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And my username?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    computed_before = prompt_tokens + two.usage.completion_tokens - 1
    cached = three.usage.prompt_tokens_details.cached_tokens
    assert cached >= computed_before // 16 * 16
    assert cached > two.usage.prompt_tokens_details.cached_tokens

    # Another tenant sends the very same prompt: nothing of the first tenant's is reused.
    _, other_key = accounts.user_with_key()
    other = client_for(other_key).chat.completions.create(
        model=MODEL, messages=first_turn, max_tokens=4, temperature=0
    )
    assert other.usage.prompt_tokens == prompt_tokens
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_cache_salt_where_the_key_allows_it(accounts, client_for):
    _, key = accounts.user_with_key(allow_cache_salt=True)
    client = client_for(key)
    messages = [{"role": "system", "content": _system_prompt(rules=5)},
                {"role": "user", "content": "Hello"}]
    salted = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                            extra_body={"cache_salt": "team-a"})
    # Same tenant, another salt: a separate partition of the cache.
    other_salt = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                                extra_body={"cache_salt": "team-b"})
    assert other_salt.usage.prompt_tokens_details.cached_tokens == 0
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                           extra_body={"cache_salt": "team-a"})
    assert again.usage.prompt_tokens_details.cached_tokens >= salted.usage.prompt_tokens // 16 * 16 - 16


def test_the_prefix_cache_receipt_comes_only_when_asked(accounts, client_for, client):
    messages = [{"role": "system", "content": _system_prompt(rules=8)},
                {"role": "user", "content": "Hello"}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert "prefix_cache" not in plain.usage.model_dump()  # SDKs see OpenAI's shape

    asked = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                           extra_body={"prefix_cache_receipt": True})
    receipt = asked.usage.model_dump()["prefix_cache"]
    assert receipt["reason"] == "full"
    assert receipt["matched_tokens"] == asked.usage.prompt_tokens_details.cached_tokens > 0

    # Another tenant, the same prompt: the tokens are cached, but not for it, and its
    # receipt says only what its own history says (no membership oracle).
    _, other_key = accounts.user_with_key()
    stream = client_for(other_key).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, stream=True,
        stream_options={"include_usage": True}, extra_body={"prefix_cache_receipt": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    receipt = usage.model_dump()["prefix_cache"]
    assert (receipt["reason"], receipt["matched_tokens"]) == ("cold", 0)
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_logprobs_with_their_top_alternatives(client):
    import openai

    done = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8,
                                          temperature=0, logprobs=True, top_logprobs=3)
    [choice] = done.choices
    content = choice.logprobs.content
    assert len(content) == done.usage.completion_tokens
    assert b"".join(bytes(t.bytes) for t in content).decode() == choice.message.content
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        # Greedy: the token taken is the most likely one.
        assert token.top_logprobs[0].token == token.token
        assert abs(token.top_logprobs[0].logprob - token.logprob) < 1e-6
        assert token.top_logprobs[0].logprob >= token.top_logprobs[-1].logprob

    # Streamed, the same tokens arrive with the chunks that carry them.
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8,
                                            temperature=0, logprobs=True, stream=True)
    streamed = [t for chunk in stream for c in chunk.choices if c.logprobs
                for t in c.logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(t.top_logprobs == [] for t in streamed)

    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, logprobs=True,
                                       top_logprobs=21)
