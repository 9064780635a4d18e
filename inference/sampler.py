"""Turn last-position logits into next tokens, honouring each request's settings.

Every setting is applied to the whole batch at once, with per-row parameters as tensors:
a row whose setting is off gets the neutral value (penalty 0, top_k = vocabulary, top_p 1,
min_p 0), so one pass serves mixed batches and the step has no per-sequence tensor work
(but a seeded row's noise, drawn from its own generator). The order, vLLM's: penalties
and logit_bias on the model's logits (`adjust_logits`), then the structured-output mask
(inference.grammar), then temperature, min_p, top-k and top-p, then the draw (`sample`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from itertools import chain

import torch

from inference.sampling_params import SamplingParams
from inference.sequence import Sequence


def _penalised(p: SamplingParams) -> bool:
    return p.presence_penalty != 0 or p.frequency_penalty != 0 or p.repetition_penalty != 1


def _short(seq: Sequence) -> bool:
    return seq.num_output_tokens < seq.params.min_tokens


def adjust_logits(logits: torch.Tensor, seqs: list[Sequence],
                  eos_token_ids: Collection[int] = ()) -> torch.Tensor:
    """logits [len(seqs), vocab] with each row's penalties and logit_bias applied, and its
    end tokens banned while it is shorter than its min_tokens (`eos_token_ids`: the
    model's, which end a row unless it ignores them): a new fp32 tensor when any row has
    one of these, `logits` itself otherwise.

    - repetition_penalty (as transformers and vLLM): a token seen in the prompt or the
      output has a positive logit divided by it, a negative one multiplied;
    - frequency_penalty and presence_penalty (as OpenAI): minus count * frequency and
      minus presence once, for each token by its count in the output so far;
    - logit_bias: added to the named tokens' logits.
    """
    rows = [i for i, s in enumerate(seqs)
            if _penalised(s.params) or s.params.logit_bias or _short(s)]
    if not rows:
        return logits
    with torch.inference_mode():
        # clone() for fp32: .to(copy=True) takes a generic path, several times slower.
        out = logits.clone() if logits.dtype == torch.float32 else logits.float()
        # Every change is sparse: read and written through the flat view by key
        # row * vocab + token, in place on the rows concerned (no copy of a row subset).
        flat, vocab = out.view(-1), out.shape[-1]
        params = [seqs[i].params for i in rows]
        if any(_penalised(p) for p in params):
            _apply_penalties(flat, vocab, len(seqs), rows, [seqs[i] for i in rows])
        if any(p.logit_bias for p in params):
            r = [i for i, p in zip(rows, params, strict=True) for _ in p.logit_bias]
            t = [int(t) for p in params for t in p.logit_bias]
            v = [float(b) for p in params for b in p.logit_bias.values()]
            flat.index_add_(0, torch.tensor(r) * vocab + torch.tensor(t),
                            torch.tensor(v, dtype=flat.dtype))
        short = [seqs[i] for i in rows if _short(seqs[i])]
        if short:
            ends = [(i, set(s.params.stop_token_ids)
                     | (set() if s.params.ignore_eos else set(eos_token_ids)))
                    for i, s in zip([i for i in rows if _short(seqs[i])], short, strict=True)]
            keys = [i * vocab + t for i, ids in ends for t in ids]
            flat.index_fill_(0, torch.tensor(keys, dtype=torch.long), float("-inf"))
    return out


def _apply_penalties(flat: torch.Tensor, vocab: int, batch: int, rows: list[int],
                     seqs: list[Sequence]) -> None:
    """In place on the flat view of logits [batch, vocab] fp32, for `seqs` at batch
    `rows`. Sparse: only the (row, token) pairs of tokens a row has seen are read and
    written, a few hundred where the vocabulary is 49k wide."""
    params = [s.params for s in seqs]
    outputs = [s.output_token_ids for s in seqs]
    at = torch.tensor(rows)
    out_rows = torch.repeat_interleave(at, torch.tensor([len(o) for o in outputs]))
    # Each (row, token) of the outputs once, with its count, as one key row * vocab + token.
    keys, counts = torch.unique(
        out_rows * vocab + torch.tensor(list(chain.from_iterable(outputs)), dtype=torch.long),
        return_counts=True)

    def per_row(values: list[float], neutral: float) -> torch.Tensor:
        by_row = torch.full((batch,), neutral)
        by_row[at] = torch.tensor(values)
        return by_row

    # The repetition penalty first, on the model's own signs (vLLM's order), over the
    # tokens of the prompt and the output.
    if any(p.repetition_penalty != 1 for p in params):
        rep = per_row([p.repetition_penalty for p in params], 1.0)
        prompt = [_prompt_tokens(s) for s in seqs]
        prompt_rows = torch.repeat_interleave(at, torch.tensor([len(t) for t in prompt]))
        seen = torch.unique(torch.cat([keys, prompt_rows * vocab + torch.cat(prompt)]))
        v, factor = flat.index_select(0, seen), rep[seen // vocab]
        flat.index_copy_(0, seen, torch.where(v > 0, v / factor, v * factor))
    if len(keys) and any(p.frequency_penalty != 0 or p.presence_penalty != 0 for p in params):
        r = keys // vocab
        freq = per_row([p.frequency_penalty for p in params], 0.0)[r]
        pres = per_row([p.presence_penalty for p in params], 0.0)[r]
        # Adding the negation is subtracting, exactly (IEEE 754).
        flat.index_add_(0, keys, -(counts * freq + pres))


def _prompt_tokens(seq: Sequence) -> torch.Tensor:
    """The distinct tokens of seq's prompt, found once per sequence: a long prompt is not
    gone through again at every step."""
    if seq.prompt_token_set is None:
        seq.prompt_token_set = torch.unique(
            torch.tensor(seq.token_ids[: seq.num_prompt_tokens], dtype=torch.long))
    return seq.prompt_token_set


# How many of a row's most likely tokens a truncated row (top_k, top_p, min_p) is drawn
# from: the draw's noise and softmax then cost K, not the vocabulary. A row whose kept
# tokens do not all fit (a top_p nucleus wider than K) is drawn over the vocabulary.
CANDIDATES = 256


def _mask_min_p_top_k(logits: torch.Tensor, top_k: torch.Tensor,
                      min_p: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    if bool((min_p > 0).any()):
        # p >= min_p * p_max  <=>  logit >= max logit + log(min_p), no softmax needed.
        floor = logits.max(dim=-1, keepdim=True).values + torch.log(min_p).unsqueeze(1)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    if bool((top_k < vocab).any()):
        k = top_k.clamp(1, vocab)
        kth = torch.topk(logits, int(k.max()), dim=-1).values.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def apply_truncation(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor) -> torch.Tensor:
    """Mask logits [R, V] (temperature applied) row by row, with per-row settings [R]:
    below min_p times the most likely token's probability, outside the top_k (ties at the
    k-th kept; k >= V: off), outside the smallest nucleus holding top_p (1: off).
    Over the whole vocabulary: `candidates` is the cheaper form the sampler uses."""
    logits = _mask_min_p_top_k(logits, top_k, min_p)
    if not bool((top_p < 1).any()):
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    # Drop a token when the tokens before it already hold top_p; keep at least one.
    drop = probs.cumsum(-1) - probs > top_p.unsqueeze(1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _candidate_count(top_k: torch.Tensor, vocab: int, size: int) -> int:
    """How many tokens a row's candidates are drawn among: `size`, or the largest top_k."""
    on_k = top_k < vocab
    return min(vocab, max(size, int(top_k[on_k].max()) if bool(on_k.any()) else 0))


def _scaled(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    return logits if temperature is None else logits.float() / temperature.unsqueeze(1)


def _most_likely(logits: torch.Tensor, k: int, top_k: torch.Tensor,
                 temperature: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """topk(logits, k) as scaled values and ids, or fewer columns where fewer decide the
    same draw: when every row has a top_k under k and no token ties with a row's k-th
    (a tie is kept, so then all k are looked at), its top_k + 1 most likely. topk's cost
    grows with k: 41 columns cost half of 256 over a 49k vocabulary."""
    narrow = int(top_k.max()) + 1
    if narrow < k and bool((top_k < logits.shape[-1]).all()):
        vals, ids = torch.topk(logits, narrow, dim=-1)
        vals = _scaled(vals, temperature)
        at = top_k.unsqueeze(1)
        if bool((vals.gather(1, at) < vals.gather(1, at - 1)).all()):
            return vals, ids
    vals, ids = torch.topk(logits, k, dim=-1)
    return _scaled(vals, temperature), ids


def candidates(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
               min_p: torch.Tensor, size: int = CANDIDATES,
               temperature: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What apply_truncation keeps, found among each row's `size` most likely tokens
    (or its top_k, if larger) instead of masking and sorting the whole vocabulary:
    (logits [R, K], their token ids [R, K], most likely first, -inf where dropped;
    covered [R]: True where every token the row keeps is among them). K may be less
    than `size` where every row's top_k keeps fewer (_most_likely). `temperature` [R]:
    `logits` are unscaled, and only the candidates are divided by it."""
    vocab = logits.shape[-1]
    on_k = top_k < vocab
    k = _candidate_count(top_k, vocab, size)
    vals, ids = _most_likely(logits, k, top_k, temperature)
    # top_k (ties with the k-th kept) and min_p (p >= min_p * p_max <=> logit >= max
    # logit + log(min_p)), as one bound per row.
    kth = vals.gather(1, (top_k.clamp(1, k) - 1).unsqueeze(1))
    bound = torch.maximum(torch.where(on_k.unsqueeze(1), kth, float("-inf")),
                          vals[:, :1] + torch.log(min_p).unsqueeze(1))
    # Past the K-th token every logit is at most the K-th's: below the bound, all dropped.
    covered = on_k | (vals[:, -1:] < bound).squeeze(1) | (k == vocab)
    vals = vals.masked_fill(vals < bound, float("-inf"))
    if bool((top_p < 1).any()):
        norm = torch.logsumexp(vals, dim=-1)  # the kept mass, where covered
        wide = (top_p < 1) & ~covered
        if bool(wide.any()):  # the mass past the candidates counts too
            w = wide.nonzero().squeeze(1)
            rows = _scaled(logits.index_select(0, w),
                           None if temperature is None else temperature[w])
            kept = _mask_min_p_top_k(rows, top_k[w], min_p[w])
            norm[w] = torch.logsumexp(kept, dim=-1)
        probs = (vals - norm.unsqueeze(1)).exp()
        held = probs.cumsum(-1)
        # Drop a token when the tokens before it already hold top_p; keep at least one.
        drop = held - probs > top_p.unsqueeze(1)
        drop[:, 0] = False
        vals = vals.masked_fill(drop, float("-inf"))
        # Every token past the K-th has the K tokens' mass before it: dropped if > top_p.
        covered |= held[:, -1] > top_p
    return vals, ids, covered


def _race(logits: torch.Tensor, generators: list, width: int = 0) -> torch.Tensor:
    """One draw per row from softmax(logits) [R, N]: the exponential race (argmax of
    p / E, E ~ Exp(1)), one vectorised pass instead of torch.multinomial, which is slow
    over a large vocabulary on CPU. Unseeded rows draw their noise in one call, as -log U
    (torch's exponential_ costs about five times as much on CPU; U = 0 gives E = inf,
    which only loses). A seeded row draws with exponential_ from its own generator, so
    its run repeats whatever else shares the batch, and as earlier versions drew it:
    `width` noise values a row (the first N used), where fewer columns than the draw
    used to take decide it (_most_likely)."""
    probs = logits.softmax(-1)
    noise = torch.empty(probs.shape[0], max(width, probs.shape[1]), dtype=probs.dtype)
    if any(g is None for g in generators):
        noise.uniform_().log_().neg_()  # seeded rows are overwritten below
    for j, g in enumerate(generators):
        if g is not None:
            noise[j].exponential_(generator=g)
    return (probs / noise[:, : probs.shape[1]]).argmax(dim=-1)


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits: [len(seqs), vocab], any float dtype -> one token id per sequence.

    Greedy rows take the first maximum in the logits' own dtype: max() is
    cheaper than argmax() over 49k columns on CPU, and casting bf16 logits to
    fp32 first would not change the winner (the cast is exact).

    Random rows are scaled by their temperature; a row with top_k, top_p or min_p is
    drawn among its CANDIDATES most likely tokens (all it keeps, almost always), others
    over the whole vocabulary. Only what a draw reads is copied or scaled: a batch of
    random rows with top_k reads the logits once (topk), never a whole-vocabulary copy.
    """
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if len(rows) == len(seqs):
        out = torch.empty(len(seqs), dtype=torch.long)
    else:
        out = logits.max(dim=-1).indices
    if not rows:
        return out.tolist()
    vocab = logits.shape[-1]
    params = [seqs[i].params for i in rows]
    gens = [seqs[i].generator for i in rows]
    idx = torch.tensor(rows)
    temps = torch.tensor([p.temperature for p in params])
    chosen = (logits if len(rows) == len(seqs) else logits.index_select(0, idx)).float()
    picked = torch.empty(len(rows), dtype=torch.long)
    cut = [j for j, p in enumerate(params) if p.top_k > 0 or p.top_p < 1 or p.min_p > 0]
    whole = sorted(set(range(len(rows))) - set(cut))
    if cut:
        c = torch.tensor(cut)
        sub = chosen if len(cut) == len(rows) else chosen.index_select(0, c)
        sub_temps = temps[c]
        top_k = torch.tensor([params[j].top_k or vocab for j in cut])
        top_p = torch.tensor([params[j].top_p for j in cut])
        min_p = torch.tensor([params[j].min_p for j in cut])
        vals, ids, covered = candidates(sub, top_k, top_p, min_p, temperature=sub_temps)
        choice = _race(vals, [gens[j] for j in cut], _candidate_count(top_k, vocab, CANDIDATES))
        picked[c] = ids.gather(1, choice.unsqueeze(1)).squeeze(1)
        wide = [n for n, ok in enumerate(covered.tolist()) if not ok]
        if wide:  # a nucleus wider than the candidates: sort the vocabulary
            r = torch.tensor(wide)
            full = apply_truncation(_scaled(sub.index_select(0, r), sub_temps[r]), top_k[r],
                                    top_p[r], min_p[r])
            picked[c[r]] = _race(full, [gens[cut[n]] for n in wide])
    if whole:
        w = torch.tensor(whole)
        picked[w] = _race(_scaled(chosen.index_select(0, w), temps[w]), [gens[j] for j in whole])
    out[idx] = picked
    return out.tolist()


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the most likely tokens at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


def token_logprobs(logits: torch.Tensor, seqs: list[Sequence],
                   tokens: list[int]) -> list[TokenLogprob | None]:
    """For each sequence that asked (params.logprobs), its token's log-probability: the
    log-softmax of `logits` as adjust_logits left them (the model's, after the request's
    penalties and logit_bias), before the structured-output mask, temperature, min_p,
    top-k and top-p (which shape the draw, not the distribution it is drawn from)."""
    rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    out: list[TokenLogprob | None] = [None] * len(seqs)
    if not rows:
        return out
    logp = torch.log_softmax(logits.index_select(0, torch.tensor(rows)).float(), dim=-1)
    k = max(seqs[i].params.logprobs for i in rows)
    top = torch.topk(logp, k, dim=-1) if k else None
    chosen = logp.gather(1, torch.tensor([[tokens[i]] for i in rows])).squeeze(1).tolist()
    for j, i in enumerate(rows):
        n = seqs[i].params.logprobs
        pairs = () if top is None else tuple(zip(top.indices[j, :n].tolist(),
                                                 top.values[j, :n].tolist(), strict=True))
        out[i] = TokenLogprob(tokens[i], chosen[j], pairs)
    return out
