"""A worker's outputs cross the channel layer as deltas and come back whole."""

from chatapp.generation.remote import _message, _Outputs
from inference.outputs import PrefixCacheRecord, RequestOutput


def _outputs() -> list[RequestOutput]:
    record = PrefixCacheRecord(matched_tokens=16, tier_tokens=0, reason="full")
    texts, ids, outs = ["Hel", "lo", " there"], [[5], [6, 7], [8]], []
    for step in range(3):
        finished = step == 2
        outs.append(RequestOutput(
            request_id="r", index=0, text_delta=texts[step], new_token_ids=ids[step],
            token_ids=sum(ids[: step + 1], []), text="".join(texts[: step + 1]),
            finished=finished, finish_reason="stop" if finished else None, prompt_tokens=20,
            cached_tokens=16, ttft=0.1, prefix_cache=record,
        ))
    return outs


def test_deltas_cross_and_the_running_text_and_ids_are_rebuilt():
    rebuild = _Outputs()
    for out in _outputs():
        message = _message(out)
        if not out.finished:  # only the deltas travel while the sample runs
            assert "text" not in message["output"] and "token_ids" not in message["output"]
        assert rebuild(message["output"]) == out


def test_logprobs_cross_as_the_engine_made_them():
    import json

    from inference.sampler import TokenLogprob

    out = _outputs()[0]
    out.new_logprobs = [TokenLogprob(5, -0.25, ((5, -0.25), (9, -1.5)))]
    # Through JSON, as the Redis channel layer carries it.
    message = json.loads(json.dumps(_message(out)))
    assert _Outputs()(message["output"]) == out


def test_a_prompt_s_logprobs_cross_as_the_engine_made_them():
    import json

    from inference.sampler import TokenLogprob

    out = _outputs()[0]
    out.prompt_logprobs = [None, TokenLogprob(7, -2.5, ((3, -0.5),)),
                           TokenLogprob(8, -0.125, ((8, -0.125),))]
    message = json.loads(json.dumps(_message(out)))
    assert _Outputs()(message["output"]) == out
