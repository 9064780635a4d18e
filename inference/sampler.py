"""Turn last-position logits into next tokens, honouring each request's settings.

Every setting is applied to the whole batch at once, with per-row parameters as tensors:
a row whose setting is off gets the neutral value (penalty 0, top_k = vocabulary, top_p 1,
min_p 0), so one pass serves mixed batches and the step has no per-sequence tensor work.
The order, as vLLM and llama.cpp apply them: penalties and logit_bias on the model's
logits (`adjust_logits`, before the structured-output mask), then temperature, min_p,
top-k and top-p, then the draw (`sample`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from itertools import chain

import torch

from inference.sequence import Sequence


def _penalised(p) -> bool:
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
    vocab = logits.shape[-1]
    with torch.inference_mode():
        out = logits.to(torch.float32, copy=True)
        whole = len(rows) == len(seqs)
        idx = None if whole else torch.tensor(rows)
        sub = out if whole else out.index_select(0, idx)
        params = [seqs[i].params for i in rows]
        if any(_penalised(p) for p in params):
            _apply_penalties(sub, [seqs[i] for i in rows], vocab)
        if any(p.logit_bias for p in params):
            r = [j for j, p in enumerate(params) for _ in p.logit_bias]
            t = [int(t) for p in params for t in p.logit_bias]
            v = [float(b) for p in params for b in p.logit_bias.values()]
            sub.index_put_((torch.tensor(r), torch.tensor(t)), torch.tensor(v), accumulate=True)
        short = [(j, seqs[i]) for j, i in enumerate(rows) if _short(seqs[i])]
        if short:
            ends = [(j, set(s.params.stop_token_ids)
                     | (set() if s.params.ignore_eos else set(eos_token_ids)))
                    for j, s in short]
            r = [j for j, ids in ends for _ in ids]
            t = [t for _, ids in ends for t in ids]
            sub[torch.tensor(r, dtype=torch.long), torch.tensor(t, dtype=torch.long)] = float("-inf")
        if not whole:
            out.index_copy_(0, idx, sub)
    return out


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence], vocab: int) -> None:
    """In place on logits [len(seqs), vocab] fp32."""
    params = [s.params for s in seqs]
    outputs = [s.output_token_ids for s in seqs]
    counts = torch.zeros_like(logits)
    lengths = torch.tensor([len(o) for o in outputs])
    if int(lengths.sum()):
        row = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
        tok = torch.tensor(list(chain.from_iterable(outputs)))
        counts.index_put_((row, tok), torch.ones(len(tok)), accumulate=True)
    # The repetition penalty first, on the model's own signs (vLLM's order).
    if any(p.repetition_penalty != 1 for p in params):
        rep = torch.tensor([p.repetition_penalty for p in params]).unsqueeze(1)
        seen = (counts > 0) | torch.stack([_prompt_mask(s, vocab) for s in seqs])
        scaled = torch.where(logits > 0, logits / rep, logits * rep)
        logits.copy_(torch.where(seen, scaled, logits))
    freq = torch.tensor([p.frequency_penalty for p in params]).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params]).unsqueeze(1)
    logits -= counts * freq + (counts > 0) * pres


def _prompt_mask(seq: Sequence, vocab: int) -> torch.Tensor:
    """The tokens of seq's prompt as a bool [vocab], built once per sequence: a long
    prompt is not scattered again at every step."""
    if seq.prompt_mask is None:
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[torch.tensor(seq.token_ids[: seq.num_prompt_tokens])] = True
        seq.prompt_mask = mask
    return seq.prompt_mask


def apply_truncation(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor) -> torch.Tensor:
    """Mask logits [R, V] (temperature applied) row by row, with per-row settings [R]:
    below min_p times the most likely token's probability, outside the top_k (ties at the
    k-th kept; k >= V: off), outside the smallest nucleus holding top_p (1: off)."""
    vocab = logits.shape[-1]
    if bool((min_p > 0).any()):
        # p >= min_p * p_max  <=>  logit >= max logit + log(min_p), no softmax needed.
        floor = logits.max(dim=-1, keepdim=True).values + torch.log(min_p).unsqueeze(1)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    use_k = bool((top_k < vocab).any())
    if bool((top_p < 1).any()):
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        if use_k:
            kth = sorted_logits.gather(1, (top_k.clamp(1, vocab) - 1).unsqueeze(1))
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens before it already hold top_p; keep at least one.
        drop = probs.cumsum(-1) - probs > top_p.unsqueeze(1)
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)
    if use_k:
        k = top_k.clamp(1, vocab)
        kth = torch.topk(logits, int(k.max()), dim=-1).values.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits: [len(seqs), vocab], any float dtype -> one token id per sequence.

    Greedy rows take the first maximum in the logits' own dtype: max() is
    cheaper than argmax() over 49k columns on CPU, and casting bf16 logits to
    fp32 first would not change the winner (the cast is exact).

    Random rows use the exponential race (argmax of p / Exp(1) draws from p):
    one vectorised pass instead of torch.multinomial, which is slow over a large
    vocabulary on CPU. Unseeded rows draw their noise in one call; a seeded row draws
    from its own generator, so its run repeats whatever else shares the batch.
    """
    out = logits.max(dim=-1).indices
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if rows:
        vocab = logits.shape[-1]
        params = [seqs[i].params for i in rows]
        idx = torch.tensor(rows)
        temps = torch.tensor([p.temperature for p in params]).unsqueeze(1)
        scaled = logits.index_select(0, idx).float() / temps
        if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
            scaled = apply_truncation(
                scaled,
                torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params]),
                torch.tensor([p.top_p for p in params]),
                torch.tensor([p.min_p for p in params]),
            )
        probs = scaled.softmax(-1)
        noise = torch.empty_like(probs)
        seeded = [j for j, i in enumerate(rows) if seqs[i].generator is not None]
        if len(seeded) < len(rows):
            noise.exponential_()  # seeded rows are overwritten below
        for j in seeded:
            noise[j].exponential_(generator=seqs[rows[j]].generator)
        out[idx] = (probs / noise).argmax(dim=-1)
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
