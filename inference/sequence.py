"""One sample of one request: its tokens, its blocks and its progress."""

from __future__ import annotations

import enum
import time

import torch

from inference.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ):
        self.request_id = request_id
        self.index = index  # sample number within the request (n > 1)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.cache_salt = cache_salt
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        # A hybrid model's other KV groups (inference/kv_groups.py): their block tables,
        # beside block_table (group 0), and for each how many leading entries a sliding
        # group has checked for release. Empty for a model with one group.
        self.group_tables: list[list[int]] = []
        self.group_released: list[int] = []
        # Chained hashes of the full blocks of token_ids, computed as blocks fill.
        self.block_hashes: list[bytes] = []
        # How many leading blocks of block_table are registered in the prefix cache.
        self.num_cached_blocks = 0
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache at first admission.
        self.num_cached_tokens: int | None = None
        # Its receipt: how much matched, from which tier, why it ended (outputs.PrefixCacheRecord).
        self.prefix_cache = None
        # Its cold miss was on tokens another tenant computed: engine-internal, counted
        # only in aggregate ("salt" in prefix_cache_miss_reasons), never in its receipt.
        self.cross_tenant_miss = False
        # block_hashes without the cache salt, filled lazily to explain misses.
        self.unsalted_block_hashes: list[bytes] = []
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        # Sibling samples wait until the first sample's prompt is in the cache.
        self.wait_for: Sequence | None = None
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed + index)
        # Timing, for TTFT and latency metrics.
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        # The prompt's distinct tokens, found by the sampler on first use when
        # params.repetition_penalty is set (sampler._prompt_tokens).
        self.prompt_token_set: torch.Tensor | None = None
        # Per generated token, when params.logprobs asks (sampler.TokenLogprob).
        self.logprobs: list = []
        # With params.prompt_logprobs, one entry per prompt position scored so far, None
        # for the first (nothing predicts it); the first sample scores it for all n.
        self.prompt_logprobs: list | None = (
            [None] if params.prompt_logprobs is not None and index == 0 else None)
        self.sent_prompt_logprobs = False
        # Its place in the structured-output grammar (inference.grammar.Matcher), if any:
        # advanced only when a sampled token is appended, never by a recompute.
        self.grammar = params.grammar.matcher() if params.grammar is not None else None
        # Detokenization state.
        self.text = ""
        self.sent_text_len = 0
        self.sent_token_len = 0
        self.prefix_offset = 0
        self.read_offset = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def cacheable_tokens(self) -> int:
        """How many leading tokens may be read from the prefix cache: all but the last,
        which is computed for its logits; while the prompt's own logprobs are being
        scored, only those before the last position scored (the hidden state at a
        position predicts the next token, and the cache holds KV, not hidden states)."""
        n = self.num_tokens - 1
        if self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens:
            n = min(n, len(self.prompt_logprobs) - 1)
        return n

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id}#{self.index}, {self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
