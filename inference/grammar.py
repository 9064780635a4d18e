"""Structured outputs: a JSON Schema turned into a grammar that masks the sampler's logits.

A request whose SamplingParams carry `json_schema` (JSON text) gets a `Grammar`, compiled
before it enters the engine (LLMEngine.compile_grammar: on the caller's thread, cached per
schema); each of its sequences gets its own `Matcher`. Every step, `mask_logits` fills the
allowed-token bitmask of the constrained rows only (other requests in the batch are left as
they are) and the sampler draws from what remains, greedy or random; the engine advances a
matcher only when it appends a sampled token, so a sequence recomputed after preemption
(which samples no token for the positions it already has) never advances it twice. Once the
grammar is complete the mask leaves only the end-of-turn token, so the reply ends as a
model-written one does ("stop", with the token that ends a remembered reply).

The grammar engine is llguidance (llama.cpp's), chosen over xgrammar (vLLM's, SGLang's)
after measuring both on SmolLM2's 49,152-token vocabulary (the figures, dated, are in
docs/benchmarks.md, "Structured outputs and tools"):

- A schema it cannot honour is refused, never loosened: llguidance rejects keywords it does
  not implement (`not`), unsatisfiable schemas (a required key that additionalProperties
  forbids) and remote `$ref`s; xgrammar 0.2.9 compiled all three and would have generated
  text the schema does not allow (failing open).
- The per-step cost has a hard bound: llguidance's parser limits (fuel per mask) end a
  pathological grammar's request with an error instead of stalling every request's step.
- Cost: xgrammar's masks are faster, but both are far below a decode step, and so is
  compiling a schema; the tokenizer index is built once per process. In the engine
  (`python -m bench grammar`) the grammar's whole work (fill + apply + advance) is a few
  per cent of a decode step at batch 1 and 16 (docs/benchmarks.md).
- It is one self-contained wheel; xgrammar pulls apache-tvm-ffi and triton.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import llguidance as llg
import torch

from inference.finite_schema import endless_part
from inference.sampling_params import InvalidRequestError

PARAM = "response_format"
# Separators as json.dumps writes them, the commonest JSON in training text, and no other
# whitespace: a small model allowed free whitespace can pad a reply with newlines forever.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Work one mask may take: lexer fuel ~14k/ms and Earley items ~20k/ms (llguidance's own
# figures), so at most ~5 ms per constrained row (the defaults allow ~15 ms). A grammar that
# runs out ends its request with an error. verbose_errors off: no parser dumps in messages.
LIMITS = dict(step_lexer_fuel=50_000, step_max_items=20_000, max_grammar_size=100_000,
              verbose_errors=False)
CACHE_SIZE = 64  # compiled schemas kept per engine
MAX_MESSAGE = 300
# How the error of a request whose grammar failed mid-reply begins (Matcher.error).
FAILED = "structured output: "


def _limits() -> llg.LLParserLimits:
    return llg.LLParserLimits(**LIMITS)


def _refusal(problem: str, param: str = PARAM) -> InvalidRequestError:
    first = problem.strip().splitlines()[0] if problem.strip() else "invalid schema"
    if len(first) > MAX_MESSAGE:
        first = first[:MAX_MESSAGE] + "..."
    return InvalidRequestError(f"The JSON schema of '{param}' is not supported: {first}",
                               param, "invalid_json_schema")


def failure_of(error: str | None) -> str | None:
    """What the grammar library said, when a request's `error` is its grammar failing
    mid-reply (out of its limits on a schema that compiled): a problem with the schema the
    caller sent, never an internal one. None for any other error."""
    if error is None or not error.startswith(FAILED):
        return None
    return error[len(FAILED):]


def grammar_for_schema(schema: str, param: str = PARAM) -> str:
    """The llguidance grammar of a JSON Schema (JSON text), checked without a tokenizer:
    cheap enough for the web process to refuse a bad schema before queueing the request.
    InvalidRequestError (naming `param`, the request field the schema came from) names
    the problem."""
    with _library_errors_refused(param):
        document = json.loads(schema)
        if not isinstance(document, dict | bool):
            raise _refusal("a schema must be a JSON object", param)
        grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None,
                                                                          limits=_limits())
    if is_error:
        raise _refusal(messages[0] if messages else "", param)
    # Compiled, yet the parser would run out of its limits mid-reply on it.
    endless = endless_part(document)
    if endless is not None:
        raise _refusal(f"no JSON value can be generated from it: {endless!r} requires a "
                       "value that contains itself, with no way to end", param)
    return grammar


@contextmanager
def _library_errors_refused(param: str = PARAM) -> Iterator[None]:
    """Whatever the grammar library raises about a schema becomes its refusal (a 400
    naming `param`), never an internal error."""
    try:
        yield
    except InvalidRequestError:
        raise
    except BaseException as exc:  # pyo3 reports a Rust panic as a BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        raise _refusal(str(exc), param) from None


class Matcher:
    """One sequence's place in its grammar."""

    __slots__ = ("matcher", "eos", "num_accepted", "finished")

    def __init__(self, matcher: llg.LLMatcher, eos: int):
        self.matcher = matcher
        self.eos = eos
        self.num_accepted = 0  # tokens it has taken (tests check recompute adds none)
        self.finished = False  # it took the end token after a complete value

    def accept(self, token: int) -> bool:
        """Advance by a sampled token; False if the grammar refuses it or has failed.

        A matcher that fails (out of fuel: LIMITS) leaves only the end token in its mask and
        then takes it as accepted: is_error() is what tells that end from a complete value."""
        ok = self.matcher.consume_token(token) and not self.matcher.is_error()
        if ok:
            self.num_accepted += 1
            self.finished = token == self.eos and self.matcher.is_stopped()
        return ok

    def error(self) -> str:
        """Why the grammar failed, as the request's error (see `failure_of`)."""
        message = self.matcher.get_error().strip()
        return FAILED + (message.splitlines()[0] if message else "the output left the grammar")


class Grammar:
    """A compiled schema: a matcher in its start state, copied for each sequence."""

    def __init__(self, template: llg.LLMatcher, eos: int):
        self._template = template
        self._eos = eos

    def matcher(self) -> Matcher:
        return Matcher(self._template.deep_copy(), self._eos)


_tokenizers: dict[tuple, llg.LLTokenizer] = {}
_tokenizers_lock = threading.Lock()


def _ll_tokenizer(tokenizer, vocab_size: int) -> llg.LLTokenizer:
    """llguidance's index of the vocabulary (~0.4 s to build), from the local tokenizer
    object (nothing is downloaded), shared by the engines of a process that use it."""
    import llguidance.hf

    key = (getattr(tokenizer, "name_or_path", ""), len(tokenizer), vocab_size,
           tokenizer.eos_token_id)
    with _tokenizers_lock:
        if key not in _tokenizers:
            _tokenizers[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        return _tokenizers[key]


class GrammarCompiler:
    """Schemas compiled against one engine's tokenizer, the last CACHE_SIZE kept."""

    def __init__(self, tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, schema: str) -> Grammar:
        with self._lock:
            if schema in self._cache:
                self._cache.move_to_end(schema)
                return self._cache[schema]
        if self._tokenizer is None:
            raise InvalidRequestError("this model has no tokenizer: 'response_format' needs one",
                                      PARAM)
        grammar = grammar_for_schema(schema)
        tok = _ll_tokenizer(self._tokenizer, self._vocab_size)
        with _library_errors_refused():
            template = llg.LLMatcher(tok, grammar, log_level=0, limits=_limits())
            probe = template.deep_copy()
            if not probe.is_error():
                # Some grammars fail only at their first mask: a 400 now, not a failed
                # reply later.
                probe.compute_bitmask()
            failed = template.is_error() or probe.is_error()
            error = (template.get_error() or probe.get_error()).strip() if failed else ""
        if failed:
            if " " not in error:  # a bare stop reason, such as NoExtensionBias
                error = f"no JSON value can be generated from it ({error})"
            raise _refusal(error)
        compiled = Grammar(template, tok.eos_token)
        with self._lock:
            self._cache[schema] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


# Byte value -> its 8 bits as additive logit masks (0 allowed, -inf not): one lookup per
# byte of the bitmask, cheaper than shifting each 32-bit word 32 times on CPU.
_BYTE_MASKS: dict[torch.dtype, torch.Tensor] = {}


def _byte_masks(dtype: torch.dtype) -> torch.Tensor:
    if dtype not in _BYTE_MASKS:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        _BYTE_MASKS[dtype] = torch.where(bits.bool(), 0.0, float("-inf")).to(dtype)
    return _BYTE_MASKS[dtype]


_ll_executor: llg.LLExecutor | None = None


def _fill(matchers: list[llg.LLMatcher], vocab: int) -> torch.Tensor:
    """The allowed-token bitmasks [rows, ceil(vocab / 32)] int32, bit t of a row = token t.

    Written straight into the tensor through llguidance's pointer API: its torch helpers
    module imports torch.compile machinery (over a second, on the first step that used it).
    Rows are filled one after another unless cores are left over by torch's threads: with
    every core taken by torch, llguidance's thread pool made 16 rows slower, with spikes,
    than a plain loop (docs/benchmarks.md)."""
    global _ll_executor
    bitmask = torch.empty(len(matchers), (vocab + 31) // 32, dtype=torch.int32)
    row_bytes, ptr = bitmask.shape[1] * 4, bitmask.data_ptr()
    spare = (os.cpu_count() or 1) - torch.get_num_threads()
    if len(matchers) > 1 and spare > 1:
        if _ll_executor is None:  # it releases the GIL while its threads work
            _ll_executor = llg.LLExecutor(num_threads=spare)
        _ll_executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], ptr,
                                             row_bytes, len(matchers))
    else:
        for i, m in enumerate(matchers):
            m.unsafe_compute_mask_ptr(ptr + i * row_bytes, row_bytes)
    return bitmask


def mask_logits(logits: torch.Tensor, seqs: list, keep: bool) -> torch.Tensor:
    """logits [len(seqs), vocab] with each constrained sequence's disallowed tokens at -inf;
    rows of unconstrained sequences untouched. `keep`: leave `logits` itself as it was (its
    caller still needs the model's own distribution, for logprobs) and mask a copy.

    The masks are filled here, after the forward: filling them on a thread during the
    forward hid their time but made the step no shorter on a 2-core host (the thread
    took a core from torch's)."""
    rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
    if not rows:
        return logits
    vocab = logits.shape[-1]
    bitmask = _fill([seqs[i].grammar.matcher for i in rows], vocab)
    # index_select, not advanced indexing: faster (docs/benchmarks.md).
    add = _byte_masks(logits.dtype).index_select(0, bitmask.view(torch.uint8).flatten().long())
    add = add.view(len(rows), -1)
    with torch.inference_mode():  # the runner's logits are inference tensors
        out = logits.clone() if keep else logits
        if len(rows) == len(seqs):
            out.add_(add[:, :vocab])
        else:
            idx = torch.tensor(rows)
            out.index_copy_(0, idx, out.index_select(0, idx) + add[:, :vocab])
    return out
