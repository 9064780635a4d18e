"""Turn last-position logits into next tokens, honouring each request's settings."""

from __future__ import annotations

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
    """logits: [len(seqs), vocab] float32 -> one token id per sequence."""
    greedy = logits.argmax(dim=-1).tolist()
    out: list[int] = []
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.greedy:
            out.append(greedy[row])
            continue
        scaled = apply_top_k_top_p(logits[row] / p.temperature, p.top_k, p.top_p)
        probs = scaled.softmax(-1)
        out.append(int(torch.multinomial(probs, 1, generator=seq.generator).item()))
    return out
