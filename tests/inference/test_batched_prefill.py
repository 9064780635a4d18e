"""A step that prefills many short prompts attends them in one batched call per
layer (kernels.attention's short-chunk path), with the outputs of one call per
sequence."""

import kernels.attention as attention
from inference import SamplingParams
from tests.inference.test_prefix_cache import rand_ids

GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


def count_calls(monkeypatch, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(attention, name)

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(attention, name, spy)
    return calls


def test_many_short_prefills_take_the_batched_path(make_engine, monkeypatch):
    engine = make_engine(max_num_seqs=32, max_num_batched_tokens=512)
    prompts = [rand_ids(12 + i % 5, 300 + i) for i in range(32)]
    batched = count_calls(monkeypatch, "_prefill_batch_attention")
    per_seq = [count_calls(monkeypatch, name) for name in
               ("_attend_held_whole", "_attend_over_prefix", "_attend_prefix_then_self")]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, GREEDY)
    engine.step()  # every prompt prefilled in this one step
    layers = engine.model_config.num_hidden_layers
    assert len(batched) == layers  # one call per layer for all 32 prompts
    assert not any(per_seq)
    while engine.has_unfinished_requests():
        engine.step()

    # Forced one call per sequence, the tokens are the same.
    got = [o[0].token_ids for o in make_engine(max_num_seqs=32, max_num_batched_tokens=512)
           .generate(prompts, GREEDY)]
    monkeypatch.setattr(attention, "_BATCH_MAX_QUERY", 0)
    alone = make_engine(max_num_seqs=32, max_num_batched_tokens=512)
    expected = [o[0].token_ids for o in alone.generate(prompts, GREEDY)]
    assert got == expected
    assert len(batched) == 2 * layers  # the two batched engines' prefill steps only
