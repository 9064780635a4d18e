"""The log-probabilities of a prompt's own tokens (SamplingParams.prompt_logprobs),
computed during prefill from the hidden states the step computes anyway.

The hidden state at position p predicts token p + 1, so a chunk of positions
[start, start + n) scores prompt tokens start + 1 .. start + n (those inside the
prompt). The logits of a whole chunk would be [chunk, vocab] at once (2 GiB for a
2,048-token chunk of Gemma 3's 262k vocabulary in fp32): they are taken a slice of
rows at a time. Positions already scored (a sequence preempted and recomputed) are
not scored again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.sampler import TokenLogprob
from inference.sequence import Sequence

SLICE_ROWS = 256


@dataclass
class _Span:
    seq: Sequence
    row: int  # the hidden row of position `first`
    first: int  # the first position whose next token is scored
    count: int


class PromptScoring:
    """The prompt positions one step scores, by sequence; falsy when there are none."""

    def __init__(self, seqs: list[Sequence], num_tokens: list[int]):
        self.spans: list[_Span] = []
        row = 0
        for seq, n in zip(seqs, num_tokens, strict=True):
            scored = seq.prompt_logprobs
            if scored is not None and len(scored) < seq.num_prompt_tokens:
                start = seq.num_computed_tokens
                first = max(start, len(scored) - 1)
                end = min(start + n, seq.num_prompt_tokens - 1)
                if end > first:
                    self.spans.append(_Span(seq, row + first - start, first, end - first))
            row += n

    def __bool__(self) -> bool:
        return bool(self.spans)

    def score(self, hidden: torch.Tensor,
              compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Append each span's entries to its sequence's prompt_logprobs: the log-softmax
        of the model's logits (no penalties or bias: they apply to generated tokens)."""
        for span in self.spans:
            seq = span.seq
            k = seq.params.prompt_logprobs or 0
            targets = seq.token_ids[span.first + 1 : span.first + 1 + span.count]
            for lo in range(0, span.count, SLICE_ROWS):
                rows = hidden[span.row + lo : span.row + min(span.count, lo + SLICE_ROWS)]
                logp = torch.log_softmax(compute_logits(rows).float(), dim=-1).cpu()
                t = targets[lo : lo + len(rows)]
                chosen = logp.gather(1, torch.tensor(t).unsqueeze(1)).squeeze(1).tolist()
                if k:
                    top = torch.topk(logp, k, dim=-1)
                    ids, values = top.indices.tolist(), top.values.tolist()
                seq.prompt_logprobs.extend(
                    TokenLogprob(token, lp, tuple(zip(ids[j], values[j], strict=True)) if k
                                 else ())
                    for j, (token, lp) in enumerate(zip(t, chosen, strict=True)))
