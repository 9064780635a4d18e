"""The context rule has one owner, the engine's (inference.sampling_params.
check_context_length): a generation's sampling parameters defer to it, and refuse in the
engine's words what the engine would refuse."""

from __future__ import annotations

import pytest

from chatapp.generation.jobs import Job, Options, sampling_params
from inference import InvalidRequestError
from inference.sampling_params import check_context_length


@pytest.fixture(scope="module")
def tokenizer():
    from inference.loader import load_tokenizer

    return load_tokenizer()


def refusal(call) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        call()
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "messages")
    return info.value


def test_an_explicit_max_tokens_over_the_room_is_refused_in_the_rules_words(tokenizer):
    job = Job(prompt_ids=(5,) * 90, cache_salt="", options=Options(max_tokens=11))
    refused = refusal(lambda: sampling_params(job, max_model_len=100, tokenizer=tokenizer))
    assert str(refused) == str(refusal(lambda: check_context_length(90, 100, 11)))
    assert "you requested 101 tokens (90 in the messages, 11 in the completion)" in str(refused)
    assert sampling_params(job, max_model_len=101, tokenizer=tokenizer).max_tokens == 11


def test_a_prompt_with_no_room_left_is_refused_as_the_engine_does(tokenizer):
    job = Job(prompt_ids=(5,) * 100, cache_salt="", options=Options(max_tokens=1))
    refused = refusal(lambda: sampling_params(job, max_model_len=100, tokenizer=tokenizer))
    assert str(refused) == str(refusal(lambda: check_context_length(100, 100)))
    assert "maximum context length is 100 tokens" in str(refused)


def test_without_max_tokens_the_default_is_cut_to_the_room(tokenizer):
    job = Job(prompt_ids=(5,) * 90, cache_salt="", options=Options(default_max_tokens=512))
    assert sampling_params(job, max_model_len=100, tokenizer=tokenizer).max_tokens == 10
