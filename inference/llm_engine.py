"""The synchronous engine: add requests, step, read outputs."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Container
from collections.abc import Sequence as Seq

from inference.config import EngineConfig
from inference.cpu_allocator import release_free_heap
from inference.detokenizer import detokenize_incrementally, find_stop_string
from inference.grammar import GrammarCompiler, mask_logits
from inference.kv_cache_manager import KVCacheManager
from inference.kv_offload import build_tier
from inference.loader import auto_weight_dtype, load_weights, resolve_model_path
from inference.metrics import EngineMetrics
from inference.miss_reason import SALT
from inference.model_runner import ModelRunner
from inference.models.registry import text_config
from inference.outputs import RequestOutput
from inference.prompt_logprobs import PromptScoring
from inference.sampler import adjust_logits, sample, token_logprobs
from inference.sampling_params import InvalidRequestError, SamplingParams, check_context_length
from inference.scheduler import Scheduler
from inference.sequence import Sequence

log = logging.getLogger(__name__)


def _load_tokenizer_if_present(path):
    from transformers import AutoTokenizer

    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(path)


def _reason_label(seq: Sequence) -> str | None:
    """Why seq's match ended, as one aggregate metric label: "evicted_pool",
    "evicted_tier", "cold", "salt" (a cold miss on another tenant's tokens), ..."""
    record = seq.prefix_cache
    if record is None:
        return None
    if seq.cross_tenant_miss:
        return SALT
    return f"{record.reason}_{record.evicted_from}" if record.evicted_from else record.reason


def check_request_id_free(request_id: str, running: Container[str]) -> None:
    """The rule for request ids, owned here: an id that is running may not be used again
    (its outputs and its abort would reach the wrong caller). LLMEngine applies it to its
    requests; AsyncEngine to its streams, which also hold ids queued but not yet added."""
    if request_id in running:
        raise InvalidRequestError(f"request id {request_id!r} is already running", "request_id")


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, tokenizer=None):
        self.config = config = config or EngineConfig()
        path = resolve_model_path(config.model, config.model_cache_dir)
        if config.weight_dtype == "auto":
            config.weight_dtype = auto_weight_dtype(config.model, path)
            log.info("weight_dtype auto: %s", config.weight_dtype)
        weights = load_weights(path)
        self.model_config = weights.config
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer_if_present(path)
        self.runner = ModelRunner(config, weights.config, weights.state_dict)
        self.cpu_path = self.runner.cpu_path
        del weights
        if self.runner.device.type == "cpu":
            release_free_heap()
        self.model_name = config.model if config.model != str(path) else path.name
        self.max_model_len = min(
            config.max_model_len,
            getattr(text_config(self.model_config), "max_position_embeddings",
                    config.max_model_len),
            self.runner.kv_groups.max_tokens(self.runner.num_blocks, config.block_size,
                                             config.lone_prefill_tokens),
        )
        self.kv = KVCacheManager(
            self.runner.num_blocks,
            config.block_size,
            enable_caching=config.enable_prefix_caching,
            hash_algorithm=config.hash_algorithm,
            # Blocks are only reusable by the same weights in the same precision.
            model_id=f"{path.resolve()}:{config.dtype}"
            + ("" if config.weight_dtype == "bf16" else f":{config.weight_dtype}"),
            groups=self.runner.kv_groups,
        )
        # The host/disk tier under the pool (None unless kv_offload_bytes or kv_dir).
        self.kv_tier = None
        if self.runner.kv_groups.hybrid:
            if config.kv_offload_bytes > 0 or config.kv_dir:
                log.warning("the host/disk KV tier (kv_offload_bytes, kv_dir) is off for %s: "
                            "the tier holds blocks of every layer, and this model keeps its "
                            "sliding-window layers' KV in groups (sliding_window_kv=False "
                            "keeps every layer whole and takes the tier)", self.model_name)
        else:
            self.kv_tier = build_tier(config, self.runner.kv_cache, self.kv.model_id)
        if self.kv_tier is not None:
            self.kv.attach_tier(self.kv_tier)
        self.scheduler = Scheduler(config, self.kv)
        self.eos_token_ids = self._eos_ids()
        self.requests: dict[str, list[Sequence]] = {}
        self.metrics = EngineMetrics()
        self._generate_ids = itertools.count()  # request ids of generate()
        self.vocab_size = text_config(self.model_config).vocab_size
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        eos = getattr(self.model_config, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(eos)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # --- requests ------------------------------------------------------------
    def encode(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("this model has no tokenizer: send token ids", "prompt")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        return list(prompt)

    def validate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise InvalidRequestError for anything wrong with a request before it is queued."""
        params.validate()
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        check_context_length(len(prompt_token_ids), self.max_model_len)
        if any(not isinstance(t, int) or t < 0 or t >= self.vocab_size for t in prompt_token_ids):
            raise InvalidRequestError(f"token ids must lie in [0, {self.vocab_size})", "prompt")
        if any(t >= self.vocab_size for t in params.logit_bias):
            raise InvalidRequestError(
                f"logit_bias token ids must lie in [0, {self.vocab_size})", "logit_bias")
        check_request_id_free(request_id, self.requests)

    def compile_grammar(self, params: SamplingParams) -> None:
        """Compile params.json_schema into params.grammar (cached per schema; a few ms, or
        ~0.4 s for the process's first). Thread-safe: AsyncEngine calls it off the step
        thread, so a compile never holds up other requests' steps. InvalidRequestError
        (param response_format) for a schema we cannot honour."""
        if params.json_schema is not None and params.grammar is None:
            params.grammar = self.grammars.compile(params.json_schema)

    def add_request(
        self,
        request_id: str,
        prompt: str | Seq[int],
        params: SamplingParams | None = None,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        params = params or SamplingParams()
        ids = self.encode(prompt)
        self.validate(request_id, ids, params)
        self.compile_grammar(params)
        seqs = []
        for i in range(params.n):
            seq = Sequence(request_id, i, ids, params, cache_salt, arrival_time)
            if i > 0:
                seq.wait_for = seqs[0]
            seqs.append(seq)
            self.scheduler.add(seq)
        self.requests[request_id] = seqs

    def abort(self, request_id: str) -> list[RequestOutput]:
        """Stop a request wherever it is; its blocks are freed (full ones stay cached)."""
        outputs = []
        for seq in self.requests.get(request_id, []):
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                outputs.append(self._finish_output(seq))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # --- stepping ------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        if sched.empty:
            return []
        sampling = [
            s for s, n in zip(sched.seqs, sched.num_tokens, strict=True)
            if s.num_computed_tokens + n == s.num_tokens
        ]
        try:
            scoring = PromptScoring(sched.seqs, sched.num_tokens)
            logits = self.runner.execute(sched.seqs, sched.num_tokens, scoring or None)
            # Penalties and logit_bias first: logprobs are of the distribution they leave.
            logits = adjust_logits(logits, sampling, self.eos_token_ids) if sampling else logits
            # Constrained rows masked by their grammars (a copy when logprobs must still
            # see the distribution before the mask); other rows as they are.
            keep = any(s.params.logprobs is not None for s in sampling)
            masked = mask_logits(logits, sampling, keep) if sampling else logits
            tokens = sample(masked, sampling) if sampling else []
            logprobs = token_logprobs(logits, sampling, tokens) if sampling else []
        except Exception as exc:  # a fault fails this step's requests, not the engine
            log.exception("engine step failed")
            outputs = []
            for seq in sched.seqs:
                self.scheduler.finish(seq, "error", error=f"generation failed: {exc}")
                outputs.append(self._finish_output(seq))
            return outputs

        for seq, n in zip(sched.seqs, sched.num_tokens, strict=True):
            seq.num_computed_tokens += n
            self.kv.cache_computed_blocks(seq)
        now = time.monotonic()
        outputs = []
        for seq, token, logprob in zip(sampling, tokens, logprobs, strict=True):
            if logprob is not None:
                seq.logprobs.append(logprob)
            self._append(seq, token, now)
            outputs.append(self._finish_output(seq) if seq.is_finished else self._output(seq))
        return outputs

    def _append(self, seq: Sequence, token: int, now: float) -> None:
        seq.append_token(token)
        if seq.grammar is not None and not seq.grammar.accept(token):
            # Only a failed grammar (out of fuel: inference/grammar.LIMITS) gets here: a
            # masked draw never picks a refused token.
            self.scheduler.finish(seq, "error", error=seq.grammar.error())
            return
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.metrics.ttft.observe(now - seq.arrival_time)
        else:
            self.metrics.inter_token.observe(now - seq.last_token_time)
        seq.last_token_time = now
        self.metrics.generation_tokens_total += 1
        p = seq.params
        before = len(seq.text)
        try:
            detokenize_incrementally(self.tokenizer, seq)
        except Exception as exc:  # a broken tokenizer fails this request only
            self.scheduler.finish(seq, "error", error=f"detokenization failed: {exc}")
            return
        reason = None
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif seq.grammar is not None and seq.grammar.finished:
            reason = "stop"  # its end token, when ignore_eos kept the rule above from seeing it
        elif p.stop and (cut := find_stop_string(seq.text, p.stop, before)) is not None:
            seq.text = seq.text[:cut]
            reason = "stop"
        elif seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        if reason:
            self.scheduler.finish(seq, reason)

    # --- outputs -------------------------------------------------------------
    def _output(self, seq: Sequence) -> RequestOutput:
        visible = len(seq.text)
        if not seq.is_finished and seq.params.stop:
            # Hold back what could be the start of a stop string.
            visible = max(seq.sent_text_len, visible - (max(map(len, seq.params.stop)) - 1))
        delta = seq.text[seq.sent_text_len : visible]
        seq.sent_text_len = visible
        out_ids = seq.output_token_ids
        new_ids = out_ids[seq.sent_token_len :]
        new_logprobs = (seq.logprobs[seq.sent_token_len : len(out_ids)]
                        if seq.params.logprobs is not None else None)
        seq.sent_token_len = len(out_ids)
        prompt_logprobs = None
        if seq.prompt_logprobs is not None and not seq.sent_prompt_logprobs:
            prompt_logprobs, seq.sent_prompt_logprobs = seq.prompt_logprobs, True
        return RequestOutput(
            request_id=seq.request_id,
            index=seq.index,
            text_delta=delta,
            new_token_ids=new_ids,
            token_ids=out_ids,  # output_token_ids is already a fresh list
            text=seq.text[:visible],
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=seq.num_cached_tokens or 0,
            ttft=None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
            error=seq.error,
            prefix_cache=seq.prefix_cache,
            new_logprobs=new_logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    def _finish_output(self, seq: Sequence) -> RequestOutput:
        out = self._output(seq)
        now = time.monotonic()
        out.metrics = {
            "e2e": now - seq.arrival_time,
            "preemptions": seq.num_preemptions,
        }
        self.metrics.prompt_tokens_total += seq.num_prompt_tokens
        self.metrics.record_finished({
            "request_id": seq.request_id,
            "index": seq.index,
            "prompt_tokens": seq.num_prompt_tokens,
            "cached_tokens": out.cached_tokens,
            "completion_tokens": seq.num_output_tokens,
            "ttft": out.ttft,
            "e2e": out.metrics["e2e"],
            "finish_reason": seq.finish_reason,
            "cache_salt_set": seq.cache_salt is not None,
            "prefix_cache": None if seq.prefix_cache is None else seq.prefix_cache.as_dict(),
            "finished_at": time.time(),  # wall clock, to merge engines' lists
        }, reason_label=_reason_label(seq))  # aggregate only: not in the per-request row
        seqs = self.requests.get(seq.request_id, [])
        if all(s.is_finished for s in seqs):
            self.requests.pop(seq.request_id, None)
        return out

    # --- conveniences --------------------------------------------------------
    def generate(
        self,
        prompts: Seq[str | Seq[int]],
        params: SamplingParams | None = None,
        cache_salt: str | None = None,
    ) -> list[list[RequestOutput]]:
        """Run prompts to completion; per prompt, the final output of each sample."""
        ids = [f"gen-{next(self._generate_ids)}" for _ in prompts]
        for rid, prompt in zip(ids, prompts, strict=True):
            self.add_request(rid, prompt, params, cache_salt)
        final: dict[str, dict[int, RequestOutput]] = {rid: {} for rid in ids}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    final[out.request_id][out.index] = out
        return [[final[rid][i] for i in sorted(final[rid])] for rid in ids]

    def prewarm(self, prompt: str | Seq[int], cache_salt: str | None = None,
                max_blocks: int = 64) -> int:
        """Copy the prompt's blocks that sit in the host/disk tier back into the pool (as
        cached free blocks) ahead of the request that will use them; at most max_blocks.
        Returns how many blocks were restored (0 without a tier)."""
        ids = self.encode(prompt)
        if any(not isinstance(t, int) for t in ids):
            raise InvalidRequestError("token ids must be integers", "prompt")
        seq = Sequence("prewarm", 0, ids, SamplingParams(), cache_salt)
        return self.kv.prewarm(seq, max_blocks)

    def persist_kv(self, max_blocks: int | None = None) -> int:
        """Write cached pool blocks to the tier's directory (kv_dir) so a restarted engine
        finds them; at most max_blocks. Returns how many were written (0 without kv_dir)."""
        return 0 if self.kv_tier is None else self.kv_tier.persist(self.kv.pool, max_blocks)

    def close(self) -> None:
        """Before the process ends: keep what the pool holds in kv_dir, if set."""
        self.persist_kv()

    def reset_prefix_cache(self) -> int:
        """Forget every cached block: the pool's hashes, the host/disk tier and the record
        of what was computed (later misses read as cold)."""
        if self.kv_tier is not None:
            self.kv_tier.clear()
        if self.kv.history is not None:
            self.kv.history.clear()
        return self.kv.pool.reset_prefix_cache()

    def metrics_snapshot(self) -> dict:
        pool = self.kv.pool
        cached_free = pool.num_cached_free_blocks
        m = self.metrics
        with m.lock:
            recent = list(m.recent)
            return {
                "engine_id": self.config.engine_id,
                "model": self.model_name,
                "prefix_cache_queries": self.kv.prefix_cache_queries,
                "prefix_cache_hits": self.kv.prefix_cache_hits,
                "hit_rate": self.kv.prefix_cache_hits / self.kv.prefix_cache_queries
                if self.kv.prefix_cache_queries else 0.0,
                "blocks_total": pool.num_blocks,
                "blocks_used": pool.num_used_blocks,
                "blocks_cached_free": cached_free,
                "blocks_free": pool.num_free_blocks - cached_free,
                "kv_cache_usage": pool.num_used_blocks / pool.num_blocks,
                "block_size": self.config.block_size,
                "evictions": pool.num_evictions,
                # Hits by where they were served from (tokens; they sum to prefix_cache_hits).
                "prefix_cache_hits_pool": self.kv.prefix_cache_hits - self.kv.prefix_cache_hits_tier,
                "prefix_cache_hits_tier": self.kv.prefix_cache_hits_tier,
                "prefix_cache_miss_reasons": dict(m.prefix_cache_miss_reasons),
                **(self.kv_tier.stats() if self.kv_tier is not None else {}),
                "preemptions": self.scheduler.num_preemptions,
                # Prefix sharing while the blocks are computed (inference/inflight.py):
                # admissions put off until another request computed the blocks they share,
                # and blocks shared so, before they were in the cache.
                "prefix_waits": self.scheduler.num_prefix_waits,
                "inflight_shared_blocks": self.scheduler.num_inflight_shared_blocks,
                "num_running": len(self.scheduler.running),
                "num_waiting": len(self.scheduler.waiting),
                "prompt_tokens_total": m.prompt_tokens_total,
                "generation_tokens_total": m.generation_tokens_total,
                "requests_finished": m.requests_finished,
                "requests_failed": m.requests_failed,
                "requests_aborted": m.requests_aborted,
                "ttft_seconds": m.ttft.snapshot(),
                "inter_token_latency_seconds": m.inter_token.snapshot(),
                "e2e_request_latency_seconds": m.e2e.snapshot(),
                "recent_requests": recent,
            }
