"""A prompt's own log-probabilities (SamplingParams.prompt_logprobs), computed during
prefill: those of the model's full forward, whatever the chunking, never read from the
prefix cache, and the blocks they computed still cached for the next request."""

from __future__ import annotations

import pytest
import torch

from inference import InvalidRequestError, SamplingParams
from tests.inference.test_parity import our_logits

PROMPT = [(i * 37 + 11) % 4000 + 5 for i in range(70)]  # 4 whole blocks and a part


def reference(engine, ids: list[int], k: int) -> list[tuple[float, list[int]]]:
    """(logprob of token p, its top-k ids) for p >= 1, from the engine's own full logits
    over the whole prompt at once (no cache: a fresh engine)."""
    cached, logits = our_logits(engine, ids, [len(ids)])
    assert cached == 0
    logp = torch.log_softmax(logits, dim=-1)
    return [(logp[p - 1, ids[p]].item(), torch.topk(logp[p - 1], k).indices.tolist())
            for p in range(1, len(ids))]


def scored(engine, ids: list[int], **params):
    """(sample 0's final output with the prompt_logprobs its first output carried, the
    other samples' final outputs)."""
    engine.add_request("scored", ids, SamplingParams(max_tokens=2, **{"temperature": 0,
                                                                      **params}))
    final, carried = {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.prompt_logprobs is not None:
                assert out.index not in carried  # sent once
                carried[out.index] = out.prompt_logprobs
            if out.finished:
                final[out.index] = out
    first, *rest = (final[i] for i in sorted(final))
    first.prompt_logprobs = carried.pop(0, None)
    assert not carried
    return first, rest


def check(entries: list, expected: list) -> None:
    assert entries[0] is None  # nothing predicts the first token
    assert len(entries) == len(expected) + 1
    for entry, (lp, top) in zip(entries[1:], expected, strict=True):
        assert entry.logprob == pytest.approx(lp, abs=1e-4)
        assert [t for t, _ in entry.top] == top


def test_prompt_logprobs_match_the_full_forward_whatever_the_chunking(make_engine):
    expected = reference(make_engine(), PROMPT, 3)
    for budget in (1024, 16, 5):  # one chunk; whole blocks; chunks across block edges
        engine = make_engine(max_num_batched_tokens=budget, lone_prefill_tokens=budget)
        out, _ = scored(engine, PROMPT, prompt_logprobs=3)
        check(out.prompt_logprobs, expected)
        assert [e.token_id for e in out.prompt_logprobs[1:]] == PROMPT[1:]


def test_a_scored_prompt_is_computed_whole_and_leaves_its_blocks_cached(make_engine):
    engine = make_engine()
    expected = reference(make_engine(), PROMPT, 0)
    warm, _ = scored(engine, PROMPT)
    assert warm.prompt_logprobs is None
    out, _ = scored(engine, PROMPT, prompt_logprobs=0)
    assert out.cached_tokens == 0 and out.prefix_cache.reason == "disabled"
    check(out.prompt_logprobs, expected)
    assert all(e.top == () for e in out.prompt_logprobs[1:])
    # What the scored request computed serves the next plain one.
    again, _ = scored(engine, PROMPT)
    assert again.cached_tokens == 64


def test_with_n_samples_the_first_carries_them_and_the_others_share_its_blocks(make_engine):
    engine = make_engine()
    first, rest = scored(engine, PROMPT, prompt_logprobs=1, n=3, temperature=1.0, seed=3)
    check(first.prompt_logprobs, reference(make_engine(), PROMPT, 1))
    assert [o.prompt_logprobs for o in rest] == [None, None]
    assert [o.cached_tokens for o in rest] == [64, 64]


@pytest.mark.parametrize("value", [-1, 21, True, 1.5])
def test_prompt_logprobs_out_of_range_are_refused(make_engine, value):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(prompt_logprobs=value).validate()
    assert err.value.param == "logprobs"
