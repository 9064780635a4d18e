"""transformers' side of the in-process comparisons: the same weights loaded by
transformers, and `generate` timed step by step on our prompts' token ids."""

from __future__ import annotations

import time

import torch

from inference.loader import reference_model


class StepClock:
    """A generate() streamer that only notes when each step's tokens arrive:
    the first call is the prompt, the second the first new token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def load_hf_model(model: str, dtype: str):
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # generate() warns about sampling fields we don't use
    hf_logging.disable_progress_bar()
    return reference_model(model, dtype=getattr(torch, dtype))


def pad_token_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


@torch.inference_mode()
def hf_generate(
    model, prompts: list[list[int]], new_tokens: int, pad_id: int
) -> tuple[StepClock, torch.Tensor]:
    """Greedy `generate` of exactly new_tokens tokens on the left-padded batch: the
    step clock and the new tokens."""
    ids, mask = left_pad(prompts, pad_id)
    clock = StepClock()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=pad_id,
        streamer=clock,
    )
    return clock, out[:, ids.shape[1] :]
