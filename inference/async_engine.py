"""The engine behind asyncio: a background thread steps it, callers stream outputs.

Commands (add, abort) are queued and applied by the step thread between steps,
so the event loop never waits for a step to finish.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence

from inference.config import EngineConfig
from inference.cpu_allocator import release_free_heap
from inference.llm_engine import LLMEngine, check_request_id_free
from inference.outputs import RequestOutput
from inference.sampling_params import InvalidRequestError, SamplingParams

log = logging.getLogger(__name__)


class _Stream:
    __slots__ = ("loop", "queue", "n", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int):
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.n = n
        self.done = 0


class _Prewarm:
    """One prewarm call: resolved with the number of blocks restored (0 if skipped)."""

    __slots__ = ("loop", "future", "key", "cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop, key):
        self.loop = loop
        self.future: asyncio.Future[int] = loop.create_future()
        self.key = key
        self.cancelled = False

    def resolve(self, result: int | BaseException) -> None:
        def put():
            if self.future.done():
                return
            if isinstance(result, BaseException):
                self.future.set_exception(result)
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # RuntimeError: the caller's loop is gone
            self.loop.call_soon_threadsafe(put)


class AsyncEngine:
    # Blocks a prewarm restores between two steps: small, so that a slice read from disk
    # holds running decodes up for a fraction of a step at most (a block's restore cost
    # from memory and from disk: docs/benchmarks.md, "Host/disk KV tier").
    PREWARM_SLICE = 8

    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None,
                 tokenizer=None):
        """Step `engine`, or an engine of `config` (with `tokenizer` if given) loaded on
        the step thread itself. Loading there matters on a CPU: each thread that starts
        an OpenMP parallel region keeps a pool of workers of its own, and once the
        process holds more such threads than it has CPUs, libgomp cuts their spinning at
        every barrier to almost none. An engine loaded on one thread and stepped on
        another decoded 76 tok/s where the same engine, loaded and stepped on one thread,
        decoded 130 (SmolLM2 int4, a 2-core AVX2 host: docs/benchmarks.md)."""
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._stopped = False
        self._unsaved = True  # the pool may hold blocks kv_dir lacks (see _persist_some)
        self._stepped = False  # stepped since it last went idle (see _release_step_memory)
        # The newest prewarm per key: an older one still queued is superseded.
        self._prewarms: dict = {}
        # Prewarms under way: [job, prompt, salt, max_blocks, restored so far], one slice
        # of PREWARM_SLICE blocks each between steps.
        self._pending_prewarms: collections.deque[list] = collections.deque()
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(config, tokenizer),
                                        name="engine-step", daemon=True)
        self._thread.start()
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error
        self.config = self.engine.config
        self.tokenizer = self.engine.tokenizer
        self.cpu_path = self.engine.cpu_path
        # The longest prompt + reply this engine takes (config, model and KV pool allow).
        self.max_model_len = self.engine.max_model_len

    # --- the caller's side ---------------------------------------------------
    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request; leaving the loop early aborts it.

        Raises InvalidRequestError (before any output) for a bad request. The request is
        only queued here: encoding and every check run on the step thread, in
        LLMEngine.add_request, which owns the engine's limits and state.
        """
        params = params or SamplingParams()
        request_id = request_id or f"req-{next(self._ids)}"
        check_request_id_free(request_id, self._streams)  # before its stream replaces one
        if params.json_schema is not None and params.grammar is None:
            # Compiled here, on a thread of its own, before the request reaches the step
            # thread: a new schema's compile never holds up the running requests' steps.
            await asyncio.to_thread(self.engine.compile_grammar, params)
        stream = _Stream(asyncio.get_running_loop(), params.n)
        self._streams[request_id] = stream
        self._send(("add", request_id, prompt, params, cache_salt, time.monotonic()))
        finished = False
        try:
            while stream.done < stream.n:
                out = await stream.queue.get()
                if isinstance(out, InvalidRequestError):
                    finished = True  # refused: the engine never took it
                    raise out
                if out.finished:
                    stream.done += 1
                yield out
            finished = True
        finally:
            if not finished:
                self.abort(request_id)
            self._streams.pop(request_id, None)

    async def prewarm(
        self,
        prompt: str | Sequence[int],
        cache_salt: str | None = None,
        max_blocks: int = 64,
        key=None,
    ) -> int:
        """Bring a prompt's blocks back from the host/disk tier into the pool ahead of its
        next request (LLMEngine.prewarm); returns how many blocks were restored.

        Queued like a request and run by the step thread between steps. It does nothing
        (returns 0) when a later prewarm with the same key (default: the cache salt) was
        queued before it ran, when requests are waiting for the engine, or when the
        caller stopped awaiting it.
        """
        key = cache_salt if key is None else key
        job = _Prewarm(asyncio.get_running_loop(), key)
        self._prewarms[key] = job
        self._send(("prewarm", job, prompt, cache_salt, max_blocks))
        try:
            return await job.future
        finally:
            job.cancelled = True

    def abort(self, request_id: str) -> None:
        """Stop a request (thread-safe); its stream, if any, gets a final 'abort' output."""
        self._send(("abort", request_id))

    def metrics(self) -> dict:
        return self.engine.metrics_snapshot()

    def reset_prefix_cache(self) -> None:
        self._send(("reset",))

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.engine.close()

    def _send(self, cmd: tuple) -> None:
        self._commands.put(cmd)
        self._wake.set()

    # --- the step thread -----------------------------------------------------
    def _run(self, config: EngineConfig | None, tokenizer) -> None:
        try:
            if self.engine is None:
                self.engine = LLMEngine(config, tokenizer=tokenizer)
        except BaseException as exc:  # handed to the constructor, which raises it
            self._load_error = exc
            return
        finally:
            self._loaded.set()
        while not self._stopped:
            self._apply_commands()
            if self._pending_prewarms:
                self._prewarm_slice()
            if not self.engine.has_unfinished_requests():
                if self._stepped:
                    self._stepped = False
                    self._release_step_memory()
                if not self._pending_prewarms:
                    self._persist_some()
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                continue
            self._unsaved = True  # a step may cache blocks kv_dir lacks
            self._stepped = True
            try:
                outputs = self.engine.step()
            except Exception:  # the engine fails requests itself; this is the last guard
                log.exception("engine loop error")
                outputs = []
                for rid in list(self.engine.requests):
                    outputs.extend(self.engine.abort(rid))
                for out in outputs:
                    out.finish_reason, out.error = "error", "engine failure"
            self._deliver(outputs)

    def _apply_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, rid, prompt, params, salt, arrival = cmd
                if rid not in self._streams:
                    continue  # the caller left before we started
                try:
                    self.engine.add_request(rid, prompt, params, salt, arrival)
                except InvalidRequestError as exc:
                    self._refuse(rid, exc)
                except Exception as exc:
                    log.exception("adding request %s failed", rid)
                    self._deliver([
                        self._error_output(rid, i, str(exc)) for i in range(params.n)
                    ])
            elif cmd[0] == "abort":
                self._deliver(self.engine.abort(cmd[1]))
            elif cmd[0] == "reset":
                self.engine.reset_prefix_cache()
            elif cmd[0] == "prewarm":
                self._pending_prewarms.append([*cmd[1:], 0])

    def _release_step_memory(self) -> None:
        """Once idle after stepping, hand the heap's free pages back (malloc_trim): the
        steps' buffers are freed but glibc keeps their pages, about 30 MiB of a SmolLM2
        server after a multi-turn replay. Busy, it keeps them, and steps fault nothing
        in; the next burst's first steps map them again."""
        if self.engine.runner.device.type == "cpu":
            release_free_heap()

    def _persist_some(self) -> None:
        """While idle, write a few cached blocks to kv_dir, so a restart (or a crash)
        loses little of what the pool holds. Once a pass writes fewer than it may, all
        is saved: idle passes after it scan nothing until the engine steps again."""
        if not self._unsaved:
            return
        try:
            self._unsaved = self.engine.persist_kv(max_blocks=16) == 16
        except Exception:
            log.exception("writing KV blocks to disk failed")

    def _prewarm_slice(self) -> None:
        """Restore one slice of the oldest pending prewarm; requeue it if more remains."""
        entry = self._pending_prewarms.popleft()
        job, prompt, salt, max_blocks, done = entry
        latest = self._prewarms.get(job.key) is job

        def finish(result) -> None:
            if self._prewarms.get(job.key) is job:  # a newer call may have replaced it
                del self._prewarms[job.key]
            job.resolve(result)

        if job.cancelled or not latest or self.engine.scheduler.waiting:
            finish(done)  # superseded, abandoned, or the engine has work queued
            return
        step = min(self.PREWARM_SLICE, max_blocks - done)
        try:
            n = self.engine.prewarm(prompt, salt, step)
        except InvalidRequestError as exc:
            finish(exc)
            return
        except Exception:  # a failed prewarm costs a later request a recompute, nothing more
            log.exception("prewarm failed")
            finish(done)
            return
        entry[4] = done = done + n
        if n == step and done < max_blocks:
            self._pending_prewarms.append(entry)  # the rest after the next step
        else:
            finish(done)

    def _refuse(self, rid: str, exc: InvalidRequestError) -> None:
        stream = self._streams.get(rid)
        if stream is not None:
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)
            except RuntimeError:  # the caller's event loop is gone
                self._streams.pop(rid, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                try:
                    stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
                except RuntimeError:  # the caller's event loop is gone
                    self._streams.pop(out.request_id, None)

    @staticmethod
    def _error_output(rid: str, index: int, msg: str) -> RequestOutput:
        """The final output of a request that failed before the engine took it."""
        return RequestOutput(
            request_id=rid, index=index, text_delta="", new_token_ids=[], token_ids=[], text="",
            finished=True, finish_reason="error", prompt_tokens=0, cached_tokens=0,
            ttft=None, error=msg,
        )
