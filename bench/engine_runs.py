"""Our engine driven in-process by the benchmarks: engines built for a run, batches run
to completion and timed, the time to first token of one request."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from inference.config import EngineConfig
from inference.llm_engine import LLMEngine
from inference.sampling_params import SamplingParams

_request_ids = itertools.count()


def engine_config(
    model: str, dtype: str, num_blocks: int, max_num_seqs: int, **kw: Any
) -> EngineConfig:
    """An engine with a pool of `num_blocks` blocks and room for `max_num_seqs` sequences;
    kw: any other EngineConfig field."""
    return EngineConfig(
        model=model, dtype=dtype, num_blocks=num_blocks, max_num_seqs=max_num_seqs, **kw
    )


def greedy(max_tokens: int) -> SamplingParams:
    """Exactly max_tokens greedy tokens (end-of-sequence ignored)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def warm_up(engine: LLMEngine, prompt: list[int]) -> None:
    """One short request: pays a first request's one-time costs and caches the prompt."""
    engine.generate([prompt], greedy(4))


@dataclass
class RunTimes:
    """One batch run to completion: when it started, when every sequence had its
    first token, when the last one finished, and the final outputs."""

    start: float
    first_token: float
    end: float
    outputs: list  # RequestOutput, in prompt order
    first_tokens: list[float]  # when each sequence had its first token, in prompt order


def run_engine(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> RunTimes:
    ids = [f"bench-{next(_request_ids)}" for _ in prompts]
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    first: dict[str, float] = {}
    final: dict[str, object] = {}
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            first.setdefault(out.request_id, now)
            if out.finished:
                final[out.request_id] = out
    end = time.perf_counter()
    return RunTimes(start, max(first.values()), end, [final[r] for r in ids],
                    [first[r] for r in ids])


def time_to_first_token(engine: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """Seconds from add_request to the first token, and the prompt tokens served from cache."""
    run = run_engine(engine, [prompt], SamplingParams(max_tokens=1, temperature=0.0))
    return run.first_token - run.start, run.outputs[0].cached_tokens


def decode_figures(batch: int, new_tokens: int, start: float, first: float, end: float) -> dict:
    """Decode rate counts the tokens after the first (the first costs a prefill);
    end-to-end rate counts all output tokens over the whole call."""
    return {
        "concurrency": batch,
        "new_tokens": new_tokens,
        "prefill_seconds": first - start,
        "decode_seconds": end - first,
        "decode_tokens_per_s": batch * (new_tokens - 1) / (end - first),
        "e2e_output_tokens_per_s": batch * new_tokens / (end - start),
    }
