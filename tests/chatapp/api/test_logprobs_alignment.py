"""logprobs.content lines up with the content: the tokens whose bytes, joined, are the
content's, whether the reply ended on its end token, a stop string inside a token, or
its length; streamed piece by piece or whole."""

from __future__ import annotations

import pytest

from chatapp.api.v1.logprobs import ContentLogprobs
from inference.sampler import TokenLogprob


@pytest.fixture(scope="module")
def tokenizer():
    from inference.loader import load_tokenizer

    return load_tokenizer()


def _entries(ids: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(t, -0.5, ((t, -0.5),)) for t in ids]


def _joined(content: list[dict]) -> bytes:
    return b"".join(bytes(e["bytes"]) for e in content)


TEXT = "The sky is blue, the grass is green. Ünïcödé 日本語 too!"


@pytest.mark.parametrize("stop", [None, "grass", "rass is", "本", "too!"])
@pytest.mark.parametrize("end_token", [True, False])
def test_joined_bytes_are_the_content_whole_and_streamed(tokenizer, stop, end_token):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    if end_token:
        ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    content = TEXT[:TEXT.index(stop)] if stop else TEXT
    entries = _entries(ids)

    whole = ContentLogprobs(tokenizer).take(entries, content, final=True)
    assert _joined(whole) == content.encode()
    assert all(e["top_logprobs"] for e in whole)
    assert "<|im_end|>" not in [e["token"] for e in whole]

    # Streamed: the text grows a few characters at a time (as a stream holds back what
    # could start a stop string) while every token is already known.
    aligned, streamed = ContentLogprobs(tokenizer), []
    for upto in range(0, len(content), 3):
        streamed += aligned.take(entries, content[:upto], final=False)
        assert len(_joined(streamed)) <= len(content[:upto].encode())
    streamed += aligned.take(entries, content, final=True)
    assert streamed == whole


def test_a_stop_string_inside_a_token_cuts_that_token_s_bytes(tokenizer):
    ids = tokenizer.encode(" wonderful", add_special_tokens=False)
    assert len(ids) == 1
    [entry] = ContentLogprobs(tokenizer).take(_entries(ids), " wonder", final=True)
    assert bytes(entry["bytes"]) == b" wonder" and entry["token"] == " wonder"
    assert entry["logprob"] == -0.5
