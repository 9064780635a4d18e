"""Turn last-position logits into next tokens, honouring each request's settings."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.sequence import Sequence


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits [V] outside the top-k and outside the smallest nucleus holding top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens before it already hold top_p; keep at least one.
        drop = probs.cumsum(-1) - probs > top_p
        drop[0] = False
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits: [len(seqs), vocab], any float dtype -> one token id per sequence.

    Greedy rows take the first maximum in the logits' own dtype: max() is
    cheaper than argmax() over 49k columns on CPU, and casting bf16 logits to
    fp32 first would not change the winner (the cast is exact).

    Random rows use the exponential race (argmax of p / Exp(1) draws from p):
    one vectorised pass instead of torch.multinomial, which is slow over a large
    vocabulary on CPU; each sequence's own generator keeps seeded runs repeatable.
    """
    out = logits.max(dim=-1).indices
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if rows:
        idx = torch.tensor(rows)
        temps = torch.tensor([seqs[i].params.temperature for i in rows]).unsqueeze(1)
        scaled = logits.index_select(0, idx).float() / temps
        for j, i in enumerate(rows):
            p = seqs[i].params
            if p.top_k > 0 or p.top_p < 1.0:
                scaled[j] = apply_top_k_top_p(scaled[j], p.top_k, p.top_p)
        probs = scaled.softmax(-1)
        noise = torch.empty_like(probs)
        for j, i in enumerate(rows):
            noise[j].exponential_(generator=seqs[i].generator)
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
    """For each sequence that asked (params.logprobs), its token's log-probability under
    the model's distribution: the log-softmax of the logits the sampler was given, before
    temperature, top-k and top-p (which shape the draw, not what the model predicted)."""
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
