"""Penalties, logit_bias, top-k, top-p and min_p: batched as the per-row formulas say,
each row by its own settings, with the grammar mask and logprobs on top."""

from __future__ import annotations

import json

import pytest
import torch

from inference import InvalidRequestError, SamplingParams
from inference.sampler import adjust_logits, apply_truncation, candidates, sample
from inference.sequence import Sequence
from tests.inference.test_prefix_cache import rand_ids

VOCAB = 300


def _seq(prompt: list[int], output: list[int], **params) -> Sequence:
    seq = Sequence("r", 0, prompt, SamplingParams(**params))
    for t in output:
        seq.append_token(t)
    return seq


def _reference_adjust(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """One row by the textbook formulas, token by token."""
    p, row = seq.params, row.clone().float()
    out = seq.output_token_ids
    for t in set(seq.token_ids):
        if p.repetition_penalty != 1:
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t in set(out):
        row[t] -= out.count(t) * p.frequency_penalty + p.presence_penalty
    for t, b in p.logit_bias.items():
        row[t] += b
    return row


def test_penalties_and_bias_over_a_mixed_batch_match_each_row_s_own_formula():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, VOCAB, generator=g) * 3
    seqs = [
        _seq([5, 6, 7], [8, 8, 9, 5], frequency_penalty=0.7),
        _seq([1, 2], [3, 3, 3], presence_penalty=-1.5, logit_bias={10: 100.0, 11: -100.0}),
        _seq([20, 21, 22, 20], [23, 21], repetition_penalty=1.3),
        _seq([30, 31], [32]),  # nothing: untouched
        _seq([40], [41, 41, 40], frequency_penalty=1.0, presence_penalty=0.5,
             repetition_penalty=0.8, logit_bias={41: 2.5}),
    ]
    adjusted = adjust_logits(logits, seqs)
    assert adjusted is not logits and adjusted.dtype == torch.float32
    for i, seq in enumerate(seqs):
        torch.testing.assert_close(adjusted[i], _reference_adjust(logits[i], seq))
    # Only the plain rows: the logits themselves, no copy.
    assert adjust_logits(logits, [seqs[3]] * 5) is logits


def test_adjusting_a_subset_of_rows_leaves_the_others_bit_for_bit():
    logits = torch.randn(4, VOCAB).bfloat16()
    seqs = [_seq([1], [2]), _seq([1], [2, 2], frequency_penalty=2.0), _seq([1], [2]),
            _seq([1], [3], logit_bias={7: -3.0})]
    adjusted = adjust_logits(logits, seqs)
    assert torch.equal(adjusted[[0, 2]], logits[[0, 2]].float())
    assert adjusted[1, 2] == logits[1, 2].float() - 4.0
    assert adjusted[3, 7] == logits[3, 7].float() - 3.0


def _reference_truncation(row: torch.Tensor, top_k: int, top_p: float,
                          min_p: float) -> set[int]:
    probs = row.softmax(-1)
    keep = {t for t in range(len(row)) if probs[t] >= min_p * probs.max()}
    if top_k:
        kth = sorted(row.tolist(), reverse=True)[top_k - 1]
        keep &= {t for t in range(len(row)) if row[t] >= kth}
    if top_p < 1:
        order = sorted(keep, key=lambda t: -row[t].item())
        mass = torch.tensor([probs[t].item() for t in order])
        mass = mass / mass.sum()
        nucleus, held = set(), 0.0
        for t, m in zip(order, mass.tolist(), strict=True):
            if held > top_p:
                break
            nucleus.add(t)
            held += m
        keep = nucleus
    return keep


@pytest.mark.parametrize("settings", [
    [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.5, 0.0), (0, 1.0, 0.2), (7, 0.6, 0.05)],
    [(3, 1.0, 0.0), (0, 1.0, 0.1)],  # top-k without any top-p: the topk path
    [(0, 0.9, 0.0), (2, 1.0, 0.0)],  # top-k rows beside top-p rows: the sort path
])
def test_top_k_top_p_min_p_per_row_keep_what_each_row_s_rule_keeps(settings):
    g = torch.Generator().manual_seed(len(settings))
    logits = torch.randn(len(settings), 64, generator=g) * 2
    out = apply_truncation(
        logits.clone(),
        torch.tensor([k or 64 for k, _, _ in settings]),
        torch.tensor([p for _, p, _ in settings]),
        torch.tensor([m for _, _, m in settings]),
    )
    for i, (k, p, m) in enumerate(settings):
        kept = set(torch.isfinite(out[i]).nonzero().flatten().tolist())
        assert kept == _reference_truncation(logits[i], k, p, m), (k, p, m)
        assert torch.equal(out[i][list(kept)], logits[i][list(kept)])


@pytest.mark.parametrize("size", [64, 12, 3])
def test_candidates_keep_what_the_whole_vocabulary_pass_keeps_or_say_they_cannot(size):
    """The sampler's candidate set: where it says a row is covered, its finite entries are
    exactly what apply_truncation keeps over the vocabulary, in order; where it is not
    (a nucleus wider than the candidates), the sampler sorts the vocabulary instead."""
    settings = [(0, 1.0, 0.2), (5, 1.0, 0.0), (0, 0.5, 0.0), (0, 0.99, 0.0), (7, 0.6, 0.05),
                (0, 0.9, 0.3), (20, 0.95, 0.0)]
    g = torch.Generator().manual_seed(size)
    logits = torch.randn(len(settings), 64, generator=g)
    top_k = torch.tensor([k or 64 for k, _, _ in settings])
    top_p = torch.tensor([p for _, p, _ in settings])
    min_p = torch.tensor([m for _, _, m in settings])
    full = apply_truncation(logits.clone(), top_k, top_p, min_p)
    vals, ids, covered = candidates(logits.clone(), top_k, top_p, min_p, size=size)
    assert vals.shape[1] >= min(size, 64) and bool(covered.any())
    for i in range(len(settings)):
        kept = set(torch.isfinite(full[i]).nonzero().flatten().tolist())
        if covered[i]:
            mine = ids[i][torch.isfinite(vals[i])].tolist()
            assert set(mine) == kept, settings[i]
            assert torch.equal(vals[i][: len(mine)], logits[i][mine])
        else:
            assert len(kept) > size - 1, settings[i]


def test_a_nucleus_wider_than_the_candidates_is_drawn_over_the_vocabulary():
    """A flat distribution's top_p 0.9 nucleus holds 90 % of the vocabulary: far more than
    the candidates. Draws still come from all of it."""
    logits = torch.zeros(1, 4000)
    seqs = [_seq([1], [], temperature=1.0, top_p=0.9, seed=i) for i in range(200)]
    drawn = {sample(logits, [s])[0] for s in seqs}
    assert max(drawn) > 1000 and len(drawn) > 150


def test_min_p_one_leaves_only_the_top_token_to_draw():
    logits = torch.randn(6, VOCAB)
    seqs = [_seq([1], [], temperature=1.5, min_p=1.0, seed=i) for i in range(6)]
    assert sample(logits, seqs) == logits.argmax(-1).tolist()


@pytest.mark.parametrize("params,param", [
    (SamplingParams(presence_penalty=2.5), "presence_penalty"),
    (SamplingParams(frequency_penalty=-3), "frequency_penalty"),
    (SamplingParams(frequency_penalty=float("nan")), "frequency_penalty"),
    (SamplingParams(repetition_penalty=0), "repetition_penalty"),
    (SamplingParams(min_p=1.5), "min_p"),
    (SamplingParams(top_k=-1), "top_k"),
    (SamplingParams(logit_bias={5: 101}), "logit_bias"),
    (SamplingParams(logit_bias={-1: 1}), "logit_bias"),
    (SamplingParams(logit_bias={"5": 1}), "logit_bias"),
    (SamplingParams(logit_bias={10**9: 1}), "logit_bias"),  # past the vocabulary
    (SamplingParams(max_tokens=4, min_tokens=5), "min_tokens"),
    (SamplingParams(min_tokens=2, json_schema='{"type": "object"}'), "min_tokens"),
])
def test_bad_sampling_settings_are_refused_naming_the_field(make_engine, params, param):
    engine = make_engine()
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("bad", [5, 6, 7], params)
    assert err.value.param == param and param in str(err.value)
    assert not engine.has_unfinished_requests()


def test_logit_bias_bans_and_forces_tokens_and_logprobs_see_it(make_engine):
    engine = make_engine()
    prompt = rand_ids(30, 1)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    [[plain]] = engine.generate([prompt], greedy)
    banned = {t: -100.0 for t in set(plain.token_ids)}
    [[other]] = engine.generate([prompt], SamplingParams(
        max_tokens=8, temperature=0, ignore_eos=True, logit_bias=banned))
    assert not set(other.token_ids) & set(plain.token_ids)
    # +100 all but forces a token, drawn at temperature 1 too; its logprob is of the
    # biased distribution (near 0), not the model's.
    forced = SamplingParams(max_tokens=6, temperature=1.0, seed=2, ignore_eos=True,
                            logit_bias={777: 100.0}, logprobs=2)
    engine.add_request("f", prompt, forced)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    entries = [e for o in outs for e in o.new_logprobs]
    assert outs[-1].token_ids == [777] * 6
    assert all(e.logprob > -1e-3 and e.top[0][0] == 777 for e in entries)


def test_min_tokens_bans_the_end_tokens_until_the_output_is_that_long(make_engine):
    engine = make_engine()
    end = 777  # an end token the bias makes the model's first choice at every step
    params = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[end],
                            logit_bias={end: 100.0}, min_tokens=5)
    [[out]] = engine.generate([rand_ids(20, 9)], params)
    assert len(out.token_ids) == 6 and out.token_ids[-1] == end
    assert end not in out.token_ids[:5] and out.finish_reason == "stop"
    # The model's own EOS too, unless ignore_eos.
    eos = next(iter(engine.eos_token_ids))
    bias = SamplingParams(max_tokens=20, temperature=0, logit_bias={eos: 100.0}, min_tokens=3)
    [[out]] = engine.generate([rand_ids(20, 9)], bias)
    assert len(out.token_ids) == 4 and out.token_ids[-1] == eos


def test_penalised_rows_leave_their_neighbours_alone(make_engine):
    """A request with every setting on, beside a plain greedy one and a JSON-constrained
    one in the same steps: each gets what it gets alone."""
    engine = make_engine()
    plain = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    busy = SamplingParams(max_tokens=10, temperature=0.9, seed=5, ignore_eos=True, top_k=40,
                          top_p=0.9, min_p=0.01, presence_penalty=0.5, frequency_penalty=1.0,
                          repetition_penalty=1.2, logit_bias={100: 5.0})
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    shaped = SamplingParams(max_tokens=40, temperature=0, frequency_penalty=1.5,
                            json_schema=json.dumps(schema))
    prompts = [rand_ids(24, 2), rand_ids(24, 3), rand_ids(24, 4)]
    params = [plain, busy, shaped]
    alone = [engine.generate([p], q)[0][0].token_ids for p, q in zip(prompts, params,
                                                                      strict=True)]
    for i, (p, q) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"t{i}", p, q)
    final = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    assert [final[f"t{i}"].token_ids for i in range(3)] == alone
    assert final["t2"].finish_reason == "stop"
    assert isinstance(json.loads(final["t2"].text)["a"], int)


@pytest.mark.parametrize("temperature, seeds", [(0.0, [0]), (0.7, [1, 2, 3])])
def test_frequency_penalty_ends_a_loop_on_smollm2(smollm2_engine, temperature, seeds):
    """A prompt that invites repetition: with frequency_penalty 1.5 the same runs (greedy,
    or seeded draws) repeat fewer 4-grams in 80 tokens than without."""
    tok = smollm2_engine.tokenizer
    text = "Write the word 'banana' again and again, as many times as you can."
    prompt = tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)

    def repeated_4grams(**penalty) -> int:
        repeats = 0
        for seed in seeds:
            params = SamplingParams(max_tokens=80, temperature=temperature, seed=seed,
                                    ignore_eos=True, **penalty)
            ids = smollm2_engine.generate([prompt], params)[0][0].token_ids
            grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
            repeats += len(grams) - len(set(grams))
        return repeats

    without, with_penalty = repeated_4grams(), repeated_4grams(frequency_penalty=1.5)
    assert with_penalty < without / 2, (with_penalty, without)


def test_top_k_rows_drawn_among_fewer_columns_draw_what_the_full_candidates_draw(monkeypatch):
    """Where every row has a top_k, the draw looks at top_k + 1 columns, not CANDIDATES:
    the same tokens, seeded row for seeded row, as drawing among all the candidates."""
    import inference.sampler as sampler

    g = torch.Generator().manual_seed(7)
    logits = torch.randn(12, 5000, generator=g) * 3

    def draws() -> list[list[int]]:
        seqs = [_seq([1], [], temperature=0.3 + 0.1 * i, top_k=5 + 3 * i, top_p=0.9 if i % 2
                     else 1.0, min_p=0.02 * (i % 3), seed=100 + i) for i in range(12)]
        return [sample(logits, seqs) for _ in range(20)]

    narrowed = draws()
    full = sampler._most_likely

    def all_candidates(logits, k, top_k, temperature):
        return full(logits, k, torch.full_like(top_k, logits.shape[-1]), temperature)

    monkeypatch.setattr(sampler, "_most_likely", all_candidates)
    assert draws() == narrowed


def test_a_tie_with_the_k_th_token_is_kept_when_top_k_is_narrowed():
    logits = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0, -1.0]] * 2)
    top_k, top_p, min_p = torch.tensor([3, 2]), torch.ones(2), torch.zeros(2)
    temperature = torch.tensor([1.0, 0.5])
    vals, ids, covered = candidates(logits, top_k, top_p, min_p, size=6,
                                    temperature=temperature)
    assert bool(covered.all())
    assert set(ids[0][torch.isfinite(vals[0])].tolist()) == {0, 1, 2, 3, 4}  # ties kept
    assert set(ids[1][torch.isfinite(vals[1])].tolist()) == {0, 1}
    # Values come back scaled by each row's temperature.
    assert vals[1][0].item() == 10.0


def test_greedy_and_random_rows_in_one_batch_each_follow_their_own_rule():
    logits = torch.randn(4, VOCAB)
    seqs = [_seq([1], [], temperature=0), _seq([1], [], temperature=1.0, top_k=1, seed=1),
            _seq([1], [], temperature=0), _seq([1], [], temperature=0.7, seed=2)]
    picked = sample(logits, seqs)
    assert picked[:3] == logits.argmax(-1)[:3].tolist()
    assert 0 <= picked[3] < VOCAB
