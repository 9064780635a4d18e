"""The HTTP side of the chat benchmarks: streamed chat completions against any
OpenAI-compatible server, timed on the client, and a workload run over them (serve,
llamacpp). What is timed and how the ceiling of the cached share is counted:
bench/serve.py's docstring."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from bench import conversations as wl
from bench.metrics import RequestRecord, cacheable_tokens
from bench.report import progress_log

log = progress_log("bench serve", clock=False)


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def load_client_tokenizer(name: str):
    """The tokenizer that counts a new message's tokens: None for `none`, or where it
    does not load (words then stand in)."""
    if name == "none":
        return None
    from inference.loader import load_tokenizer

    try:
        return load_tokenizer(name)
    except Exception as exc:  # counting tokens is a nicety; words stand in
        log(f"no tokenizer ({exc}); counting words instead")
        return None


@dataclass(frozen=True)
class ClientOptions:
    url: str
    api_key: str | None = None  # None: $OPENAI_API_KEY
    model: str | None = None  # None: the first of /v1/models
    timeout: float = 600.0  # seconds per request
    temperature: float = 0.0
    ignore_eos: bool = False  # ask for exactly max_tokens (vLLM's and SGLang's fields)


class Client:
    """One streamed chat completion per call, timed on the client."""

    def __init__(self, options: ClientOptions):
        from openai import AsyncOpenAI

        self.options = options
        self.api = AsyncOpenAI(
            base_url=base_url(options.url),
            api_key=options.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            max_retries=0,
            timeout=options.timeout,
        )
        self.model = options.model

    async def resolve_model(self) -> str:
        if not self.model:
            models = await self.api.models.list()
            if not models.data:
                raise SystemExit("the server lists no models: pass --model")
            self.model = models.data[0].id
        return self.model

    async def complete(self, rec: RequestRecord, messages: list[dict], max_tokens: int) -> str:
        """Send one request, fill `rec` in; returns the reply's text."""
        extra: dict = {}
        if self.options.ignore_eos:  # vLLM and SGLang honour these; others ignore them
            extra = {"ignore_eos": True, "min_tokens": max_tokens}
        parts: list[str] = []
        usage = None
        rec.start = time.perf_counter()
        try:
            stream = await self.api.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=max_tokens,
                temperature=self.options.temperature,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra or None,
            )
            async for chunk in stream:
                now = time.perf_counter()
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices or []:
                    text = getattr(choice.delta, "content", None) if choice.delta else None
                    if text:
                        if rec.first_token is None:
                            rec.first_token = now
                        rec.chunk_times.append(now)
                        parts.append(text)
            rec.end = time.perf_counter()
        except Exception as exc:  # a failed request is counted, the run goes on
            rec.end = None
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
        if usage is not None:
            rec.prompt_tokens = usage.prompt_tokens or 0
            rec.completion_tokens = usage.completion_tokens or 0
            details = getattr(usage, "prompt_tokens_details", None)
            rec.cached_tokens = (getattr(details, "cached_tokens", None) or 0) if details else 0
        else:
            rec.completion_tokens = len(rec.chunk_times)  # a lower bound without usage
        if rec.ok and rec.first_token is None:
            rec.error = "no content in the stream"
        return "".join(parts)


async def run_workload(
    client: Client, workload: wl.Workload, concurrency: int
) -> tuple[list, float]:
    """Every conversation, at most `concurrency` at a time; returns (records, seconds)."""
    queue: asyncio.Queue[wl.Conversation] = asyncio.Queue()
    for conv in workload.conversations:
        queue.put_nowait(conv)
    records: list[RequestRecord] = []
    total = workload.num_requests

    async def worker() -> None:
        while True:
            try:
                conv = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            replies: list[str] = []
            for k in range(len(conv.turns)):
                rec = RequestRecord(conversation=conv.index, turn=k + 1, start=0.0)
                reply = await client.complete(rec, conv.messages(replies), workload.reply_tokens)
                records.append(rec)
                if len(records) % max(1, total // 10) == 0:
                    log(f"{len(records)}/{total} requests")
                if not rec.ok:
                    break  # the later turns need this reply
                replies.append(reply)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return records, time.perf_counter() - start


def fill_max_cached(
    records: list[RequestRecord],
    workload: wl.Workload,
    overhead: int,
    block_size: int,
    warmed: bool = True,
) -> None:
    """Set each record's theoretical ceiling from the token counts (see serve's doc)."""
    by_key = {(r.conversation, r.turn): r for r in records}
    for r in records:
        if not r.ok:
            continue
        conv = workload.conversations[r.conversation]
        new = conv.turns[r.turn - 1].user_tokens + overhead
        if r.turn == 1:
            history = None if workload.system_seen_before(r.conversation, warmed) else 0
        else:
            prev = by_key.get((r.conversation, r.turn - 1))
            # The previous reply's last token is never fed back, so its KV never exists.
            history = prev.prompt_tokens + prev.completion_tokens - 1
        r.max_cached_tokens = cacheable_tokens(r.prompt_tokens, new, history, block_size)


async def measure(
    client: Client,
    workload: wl.Workload,
    concurrency: int,
    tokenizer,
    block_size: int,
    warmup: bool = True,
) -> tuple[dict | None, list[RequestRecord], float]:
    """The optional warm-up request, then the workload; each record gets its theoretical
    ceiling. Returns (the warm-up's record as a dict or None, records in order, seconds)."""
    warm = None
    if warmup:
        rec = RequestRecord(conversation=-1, turn=0, start=0.0)
        await client.complete(rec, workload.warmup_messages(), 4)
        warm = rec.as_dict()
        if not rec.ok:
            log(f"warm-up failed: {rec.error}")
    records, seconds = await run_workload(client, workload, concurrency)
    records.sort(key=lambda r: (r.conversation, r.turn))
    fill_max_cached(
        records,
        workload,
        wl.template_overhead(tokenizer),
        block_size,
        warmed=warm is not None and warm["ok"],
    )
    return warm, records, seconds
