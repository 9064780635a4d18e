"""Torch ops for attention over a paged KV cache: the CPU path, and the oracle
for the Triton kernels (they run on any device; on CPU they pick, per shape,
between batched matmuls around a softmax and torch's flash kernel, and hand the
parts that torch does slowly there to the C kernels of kernels/cpu_kernels where
those run).

Layout (as nano-vllm): one cache tensor per layer for K and one for V, shaped
[num_blocks, block_size, num_kv_heads, head_dim] (an int8 cache: rows of head_dim + 4
bytes, kernels/kv_quant). A token's slot is block_id * block_size + offset; slot -1
means "don't store".

"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F

from kernels import cpu_kernels, f32_kernels, kv_quant
from kernels.cpu_features import has_amx


@dataclass
class DecodeBatch:
    """Single-token queries gathered for one padded attention call."""

    rows: list[int]  # which sequences
    token_idx: torch.Tensor  # [B] their query tokens in the flat batch
    tables: torch.Tensor  # [B, max_blocks] their block tables, cut to the longest context
    lens: torch.Tensor  # [B] int64 their context lengths
    max_len: int
    all_rows: bool  # every query token of the step is a decode, in order
    _masks: dict = field(default_factory=dict, repr=False, compare=False)

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The padding past each context as an additive mask [B, 1, 1, max_len] (0 or
        -inf) in dtype, for the padded flash call; built once per step, and only when
        asked (the C kernel reads each context's own length). None when no row is
        padded."""
        if dtype not in self._masks:
            mask = None
            if int(self.lens.min()) < self.max_len:
                positions = torch.arange(self.max_len, device=self.lens.device)
                padding = (positions[None, :] >= self.lens[:, None])[:, None, None, :]
                mask = torch.zeros(padding.shape, dtype=dtype, device=padding.device)
                mask.masked_fill_(padding, float("-inf"))
            self._masks[dtype] = mask
        return self._masks[dtype]


@dataclass
class PrefillBatch:
    """Short prefill chunks of several sequences (each possibly over a cached prefix),
    padded to one shape for a single attention call: B chunks of at most n_max
    queries over at most max_len keys."""

    rows: list[int]  # which sequences
    query_idx: torch.Tensor  # [B * n_max] each padded query's token in the flat batch
    out_idx: torch.Tensor  # the flat-batch tokens of the real queries, in padded order
    # Where the real queries lie among the B * n_max padded ones; None: no padding.
    real_rows: torch.Tensor | None
    # The flat-batch range of the chunks when they lie there in this order, unpadded
    # (queries and outputs are then views and slices, not gathers and scatters).
    span: tuple[int, int] | None
    tables: torch.Tensor  # [B, max_blocks] their block tables, cut to the longest context
    lens: torch.Tensor  # [B] int64 their context lengths
    query_lens: torch.Tensor  # [B] int64 their chunk lengths
    n_max: int
    max_len: int
    _masks: dict = field(default_factory=dict, repr=False, compare=False)

    def mask(self, group: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, group * n_max, max_len], rows ordered (head of a KV
        group, query) as _fold_groups folds them: query j of a chunk of n over L
        keys sees keys 0 .. L - n + j; a padding query sees what the chunk's last
        one sees (so no row is all -inf), and its output is dropped. Built once per
        step and shared by every layer."""
        key = (group, dtype)
        if key not in self._masks:
            device = self.lens.device
            j = torch.arange(self.n_max, device=device)[None, :]
            last = (self.lens - self.query_lens)[:, None] + torch.minimum(
                j, self.query_lens[:, None] - 1
            )  # [B, n_max]: the last key each query sees
            hidden = torch.arange(self.max_len, device=device)[None, None, :] > last[:, :, None]
            mask = torch.zeros(hidden.shape, dtype=dtype, device=device)
            mask.masked_fill_(hidden, float("-inf"))
            self._masks[key] = mask.repeat(1, group, 1)[:, None]
        return self._masks[key]


@dataclass
class AttentionMetadata:
    """How the flat batch of query tokens maps onto sequences and KV blocks.

    Sequences are ordered: those with several query tokens (prefill chunks) and
    those with one (decode) may be mixed; `query_lens` says which is which.
    Index tensors and masks derived from it are built once per step and shared
    by every layer.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0
    query_start_loc: list[int]  # len num_seqs + 1, offsets into the token batch
    seq_lens: list[int]  # context length per sequence after this step (cached + new)
    _derived: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def all_slots_valid(self) -> bool:
        """No token of the step skips its store (checked once, not in every layer)."""
        return bool((self.slot_mapping >= 0).all())

    @cached_property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)

    @cached_property
    def query_lens(self) -> list[int]:
        q = self.query_start_loc
        return [q[i + 1] - q[i] for i in range(len(q) - 1)]

    def decode_batch(self, block_size: int) -> DecodeBatch | None:
        """The decode rows batched together; None when there are none."""
        key = ("decode", block_size)
        if key not in self._derived:
            self._derived[key] = self._build_decode_batch(block_size)
        return self._derived[key]

    def _build_decode_batch(self, block_size: int) -> DecodeBatch | None:
        rows = [i for i, n in enumerate(self.query_lens) if n == 1]
        if not rows:
            return None
        device = self.block_tables.device
        lens = [self.seq_lens[i] for i in rows]
        max_len = max(lens)
        max_blocks = (max_len + block_size - 1) // block_size
        idx = torch.tensor(rows, device=device)
        return DecodeBatch(
            rows=rows,
            token_idx=torch.tensor([self.query_start_loc[i] for i in rows], device=device),
            tables=self.block_tables.index_select(0, idx)[:, :max_blocks],
            lens=torch.tensor(lens, dtype=torch.int64, device=device),
            max_len=max_len,
            all_rows=len(rows) == len(self.seq_lens),
        )

    def prefill_batches(self, block_size: int) -> list[PrefillBatch]:
        """The short prefill chunks grouped for batched attention (see
        group_short_prefills); empty when fewer than two would share a call."""
        key = ("prefill", block_size)
        if key not in self._derived:
            groups = group_short_prefills(self.query_lens, self.seq_lens)
            self._derived[key] = [self._build_prefill_batch(g, block_size) for g in groups]
        return self._derived[key]

    def _build_prefill_batch(self, rows: list[int], block_size: int) -> PrefillBatch:
        device = self.block_tables.device
        ns = [self.query_lens[i] for i in rows]
        lens = [self.seq_lens[i] for i in rows]
        n_max, max_len = max(ns), max(lens)
        idx, real, real_rows = [], [], []
        for i, n in zip(rows, ns, strict=True):
            start = self.query_start_loc[i]
            real_rows += range(len(idx), len(idx) + n)
            idx += list(range(start, start + n)) + [start] * (n_max - n)
            real += range(start, start + n)
        first = self.query_start_loc[rows[0]]
        padded = len(real) < len(idx)
        in_place = not padded and real == list(range(first, first + len(real)))
        max_blocks = (max_len + block_size - 1) // block_size
        return PrefillBatch(
            rows=rows,
            query_idx=torch.tensor(idx, device=device),
            out_idx=torch.tensor(real, device=device),
            real_rows=torch.tensor(real_rows, device=device) if padded else None,
            span=(first, first + len(real)) if in_place else None,
            tables=self.block_tables.index_select(0, torch.tensor(rows, device=device))[
                :, :max_blocks
            ],
            lens=torch.tensor(lens, dtype=torch.int64, device=device),
            query_lens=torch.tensor(ns, dtype=torch.int64, device=device),
            n_max=n_max,
            max_len=max_len,
        )

    def chunk_mask(self, n: int, group: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive causal mask [group * n, n] of a chunk's n queries over its own n
        keys, rows ordered (head of a KV group, query) as _fold_groups folds them:
        0 where a key is visible, -inf past the query. Built once per step and
        shared by every layer (and by every chunk of n tokens)."""
        key = ("chunk", n, group, dtype)
        if key not in self._derived:
            device = self.block_tables.device
            future = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
            mask = torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(future, float("-inf"))
            self._derived[key] = mask.repeat(group, 1)
        return self._derived[key]

    def prefix_mask(self, i: int, group: int, dtype: torch.dtype) -> torch.Tensor:
        """Sequence i's chunk mask widened over its cached keys, which every query
        sees: [1, 1, group * n, L], for attention calls that take a whole mask."""
        key = ("prefix", i, group, dtype)
        if key not in self._derived:
            n, length = self.query_lens[i], self.seq_lens[i]
            own = self.chunk_mask(n, group, dtype)
            self._derived[key] = F.pad(own, (length - n, 0))[None, None]
        return self._derived[key]


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    all_valid: bool | None = None,
) -> None:
    """Write key/value [num_tokens, kv_heads, head_dim] into their cache slots (an int8
    cache takes them quantized, kernels/kv_quant); all_valid=True
    (AttentionMetadata.all_slots_valid) skips the per-call check."""
    # fp32 rows on the CPU: one C pass (the decode step's own store), where torch took a
    # dozen ops a layer to round int8 rows.
    if (f32_kernels.runs_store_kv(key, value, k_cache) and slot_mapping.is_cpu
            and slot_mapping.dtype == torch.int64):
        f32_kernels.store_kv(key, value, k_cache, v_cache, slot_mapping.contiguous())
        return
    if not all_valid:
        keep = slot_mapping >= 0
        if not bool(keep.all()):
            key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    if kv_quant.is_quantized(k_cache):
        key, value = kv_quant.quantize(key), kv_quant.quantize(value)
    rows = k_cache.shape[2:]
    k_cache.view(-1, *rows).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, *rows).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def widened(kv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K or V read from the cache, in the queries' dtype: a bf16 or int8 cache under an
    fp32 model (a compact KV cache, EngineConfig.kv_dtype) is widened (int8: scaled,
    kernels/kv_quant) once read, so the attention's arithmetic stays fp32. Queries are
    never narrower than the cache."""
    if kv_quant.is_quantized(kv):
        return kv_quant.dequantize(kv, dtype)
    return kv if kv.dtype == dtype else kv.to(dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence's K or V: [length, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:num_blocks])
    return blocks.flatten(0, 1)[:length]


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of every query token over its sequence's cached context.

    query: [num_tokens, num_heads, head_dim]. A sequence with q query tokens and
    context length L holds positions L-q .. L-1; query j sees keys 0 .. L-q+j.
    Grouped-query attention: num_heads is a multiple of the cache's kv heads.
    A sliding-window layer (window W) also hides the keys W or more positions
    before a query's own (see windowed_attention).
    """
    if window_applies(meta, window):
        return windowed_attention(query, k_cache, v_cache, meta, scale, window)
    decode = meta.decode_batch(k_cache.shape[1])
    if decode is not None and decode.all_rows:  # a step of decodes only: the common case
        return _decode_attention(query, k_cache, v_cache, decode, scale).to(query.dtype)
    out = torch.empty_like(query)
    batched = set(decode.rows) if decode else set()
    for p in meta.prefill_batches(k_cache.shape[1]):
        o = _prefill_batch_attention(query, k_cache, v_cache, p, scale).to(out.dtype)
        if p.span is not None:
            out[p.span[0] : p.span[1]] = o
        else:
            out.index_copy_(0, p.out_idx, o)
        batched.update(p.rows)
    num_heads = query.shape[1]
    group = num_heads // k_cache.shape[2]
    for i, n in enumerate(meta.query_lens):
        if i in batched:
            continue
        start, length = meta.query_start_loc[i], meta.seq_lens[i]
        q = query[start : start + n]
        table = meta.block_tables[i]
        if own_prefill_runs(q, k_cache):
            out[start : start + n] = f32_kernels.prefill_attention(
                q, k_cache, v_cache, table, length, scale)
            continue
        held_whole = (
            query.is_cpu
            and k_cache.dtype in _HELD_WHOLE_DTYPES
            and query.dtype == k_cache.dtype
            and num_heads * n * length <= _MAX_SCORES
        )
        if held_whole:
            k, v = _head_major(k_cache, table, length), _head_major(v_cache, table, length)
            o = _attend_held_whole(q, k, v, meta.chunk_mask(n, group, k.dtype), scale)
            out[start : start + n] = o.to(out.dtype)
            continue
        k = widened(gather_kv(k_cache, table, length), query.dtype)
        v = widened(gather_kv(v_cache, table, length), query.dtype)
        if n == length:  # a whole prompt: plain causal attention
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0).to(k.dtype),
                k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0),
                is_causal=True,
                scale=scale,
                enable_gqa=True,
            )[0].transpose(0, 1)
        elif group * n * length <= _MAX_PREFIX_MASK or not query.is_cpu:
            o = _attend_over_prefix(q, k, v, meta.prefix_mask(i, group, k.dtype), scale)
        else:
            o = _attend_prefix_then_self(q, k, v, scale)
        out[start : start + n] = o.to(out.dtype)
    if decode:
        rows = query.index_select(0, decode.token_idx)
        o = _decode_attention(rows, k_cache, v_cache, decode, scale)
        out.index_copy_(0, decode.token_idx, o.to(out.dtype))
    return out


# Short prefill chunks of several sequences attend in one call, padded to the
# longest chunk and context of their group, rather than one call (and one gather)
# per sequence per layer: at 32 prompts of 16 tokens the per-call overheads were most
# of the attention's time. A chunk batches when it has at most _BATCH_MAX_QUERY
# tokens over at most _BATCH_MAX_LEN keys and at most _BATCH_MAX_CHUNK_SCORES
# scores per head, and a group is cut where padding would more than double its work
# (queries x keys). Past these the per-sequence calls measured as fast or faster,
# with AMX and with scores held whole per sequence alike (per shape:
# docs/benchmarks.md, "CPU kernels").
_BATCH_MAX_QUERY = 32
_BATCH_MAX_LEN = 128
_BATCH_MAX_CHUNK_SCORES = 2048
_BATCH_MAX_PADDING = 2.0


def group_short_prefills(query_lens: list[int], seq_lens: list[int]) -> list[list[int]]:
    """The prefill chunks (more than one query token) short enough to batch, in
    groups of similar context length whose padded work stays within
    _BATCH_MAX_PADDING of their real work; groups of one are left out."""
    short = sorted(
        (
            i
            for i, n in enumerate(query_lens)
            if 1 < n <= _BATCH_MAX_QUERY
            and seq_lens[i] <= _BATCH_MAX_LEN
            and n * seq_lens[i] <= _BATCH_MAX_CHUNK_SCORES
        ),
        key=lambda i: seq_lens[i],
    )
    groups: list[list[int]] = []
    group: list[int] = []
    n_max = real = 0
    for i in short:
        n, length = query_lens[i], seq_lens[i]
        # Sorted by context length, so this one's is the group's longest.
        padded = (len(group) + 1) * max(n_max, n) * length
        if group and padded > _BATCH_MAX_PADDING * (real + n * length):
            groups.append(group)
            group, n_max, real = [], 0, 0
        group.append(i)
        n_max, real = max(n_max, n), real + n * length
    groups.append(group)
    return [g for g in groups if len(g) > 1]


def _prefill_batch_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    p: PrefillBatch,
    scale: float,
) -> torch.Tensor:
    """Causal attention of several short chunks, each over its cached prefix and
    itself, in one call; returns [real queries, H, D] in p.out_idx's order.

    K/V are gathered by block table into [B, kv_heads, max_len, D] views (as for
    decodes), the heads of a KV group are folded into its query rows, and the
    per-sequence mask (PrefillBatch.mask) hides each chunk's future and padding.
    On CPU the scores are held whole, on any CPU: two batched matmuls around an
    fp32 softmax, the scores rounded to the model's dtype first as in
    _attend_held_whole. At these sizes the flash kernel's per-block overheads
    dominate even with AMX (docs/benchmarks.md, "CPU kernels"). Elsewhere, or past
    _MAX_SCORES, one flash call."""
    b = p.tables.shape[0]
    kv_heads, head_dim = k_cache.shape[2], query.shape[2]
    heads = query.shape[1]
    group = heads // kv_heads
    rows = group * p.n_max
    blocks = p.tables.reshape(-1)
    k = widened(k_cache.index_select(0, blocks), query.dtype)
    v = widened(v_cache.index_select(0, blocks), query.dtype)
    k = k.view(b, -1, kv_heads, head_dim)[:, : p.max_len].transpose(1, 2)  # [B, kv, L, D]
    v = v.view(b, -1, kv_heads, head_dim)[:, : p.max_len].transpose(1, 2)
    # Queries: a view when the chunks lie in place, else gathered with their padding.
    q = query[p.span[0] : p.span[1]] if p.span else query.index_select(0, p.query_idx)
    q = q.view(b, p.n_max, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    if query.is_cpu and b * heads * p.n_max * p.max_len <= _MAX_SCORES:
        q = q.reshape(b * kv_heads, rows, head_dim).to(k.dtype)
        k = k.reshape(b * kv_heads, p.max_len, head_dim)
        scores = torch.bmm(q, k.transpose(1, 2)).view(b, kv_heads, rows, p.max_len)
        # Scaled with the mask added, in one op into fp32 (scaling the queries first
        # costs more than the scores here; for a power-of-two scale the two agree).
        scores = torch.add(p.mask(group, torch.float32), scores, alpha=scale)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        o = torch.matmul(probs, v)
    else:
        q = q.reshape(b, kv_heads, rows, head_dim).to(k.dtype)
        o = _flash(q, k, v, p.mask(group, k.dtype), scale)
    o = o.view(b, kv_heads, group, p.n_max, head_dim).permute(0, 3, 1, 2, 4)
    o = o.reshape(b * p.n_max, heads, head_dim)
    return o if p.real_rows is None else o.index_select(0, p.real_rows)


# Torch's CPU flash kernel; it also returns the log-sum-exp of every row.
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Attention [B, H, n, D] with an optional additive mask: torch's CPU flash kernel
    called directly (SDPA's dispatcher sends a masked bf16 call to its slow math
    path), SDPA elsewhere."""
    if q.is_cpu:
        return _CPU_FLASH(q, k, v, attn_mask=mask, scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# On CPU, in bf16 without AMX, a prompt or a chunk over its cached prefix attends
# with its n x L scores held whole (heads * n * L elements, 32 MB at most): two
# batched matmuls around a softmax beat torch's flash kernel there. With AMX the
# flash kernel runs on AMX tiles and is the faster; in fp32 the two are even. Past
# the limit the flash kernel is faster again (measured per shape: docs/benchmarks.md,
# "CPU kernels").
def held_whole_dtypes(amx: bool) -> frozenset[torch.dtype]:
    """The cache dtypes whose CPU attention holds its scores whole."""
    return frozenset() if amx else frozenset({torch.bfloat16})


_HELD_WHOLE_DTYPES = held_whole_dtypes(has_amx())
_MAX_SCORES = 1 << 24
# Otherwise a chunk over a cached prefix takes one flash call with an additive mask
# of group * n * L elements (a few MB at most), and past that two unmasked calls.
_MAX_PREFIX_MASK = 1 << 22


def _head_major(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's K or V as [kv_heads, length, D], contiguous: in one pass by
    kernels/cpu_kernels where it runs, else gathered and then transposed."""
    if cpu_kernels.runs_gather(cache):
        return cpu_kernels.gather_head_major(cache, table, length)
    return gather_kv(cache, table, length).transpose(0, 1).contiguous()


def _fold_groups(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Queries [n, H, D] as [1, kv_heads, group * n, D]: the heads sharing a KV head
    become that head's query rows, ordered (group member, query), so K/V need no
    repeating for grouped-query attention."""
    n, heads, dim = query.shape
    group = heads // kv_heads
    return query.view(n, kv_heads, group, dim).permute(1, 2, 0, 3).reshape(1, kv_heads, -1, dim)


def _unfold_groups(o: torch.Tensor, n: int) -> torch.Tensor:
    """Attention output [kv_heads, group * n, D] in _fold_groups' row order back to
    [n, H, D]."""
    kv_heads, rows, dim = o.shape
    group = rows // n
    return o.view(kv_heads, group, n, dim).permute(2, 0, 1, 3).reshape(n, kv_heads * group, dim)


def _attend_held_whole(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    chunk_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of n queries [n, H, D], the last n of L positions, over keys
    and values in head-major order [kv_heads, L, D] (_head_major), with all n x L
    scores held at once (the CPU path):
    one batched matmul, the heads sharing a KV head folded into that head's query
    rows (K/V never repeated); the scores are rounded to the model's dtype before an
    fp32 softmax, as transformers' eager attention does. Only the chunk's own keys
    take the causal mask (AttentionMetadata.chunk_mask): the cached ones are all
    visible. In bf16 the softmax is kernels/cpu_kernels's where it runs (it masks
    by row index and ignores chunk_mask)."""
    n = query.shape[0]
    kv_heads, length = key.shape[0], key.shape[1]
    # Pre-scaling the queries is exact for a power-of-two scale (head_dim 64).
    q = _fold_groups((query * scale).to(key.dtype), kv_heads)[0]  # [kv, group * n, D]
    scores = torch.bmm(q, key.transpose(1, 2))
    if scores.dtype == torch.bfloat16 and cpu_kernels.available():
        probs = cpu_kernels.causal_softmax_(scores, n)  # the mask from the row index
    else:
        scores[:, :, length - n :].add_(chunk_mask)
        probs = torch.softmax(scores, dim=-1)
    return _unfold_groups(torch.bmm(probs, value), n)


def _attend_over_prefix(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """The same attention in one flash call with the whole mask (SDPA away from the
    CPU): the heads of a KV group are folded into its query rows, as above."""
    kv_heads = key.shape[1]
    o = _flash(
        _fold_groups(query.to(key.dtype), kv_heads),
        key.transpose(0, 1).unsqueeze(0),
        value.transpose(0, 1).unsqueeze(0),
        mask,
        scale,
    )
    return _unfold_groups(o[0], query.shape[0])


def _attend_prefix_then_self(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of n queries [n, H, D], the last n of L positions, over keys
    and values [L, kv_heads, D], with no mask: every query sees all L - n cached
    keys (one flash call, the heads of a KV group folded into its query rows) and
    the new keys causally (a second, is_causal flash call); the two softmaxes are
    merged by their log-sum-exps (CPU flash attention returns them)."""
    n, heads, dim = query.shape
    length, kv_heads = key.shape[0], key.shape[1]
    group, prefix = heads // kv_heads, length - n
    k = key.transpose(0, 1).unsqueeze(0)  # [1, kv, L, D], a view
    v = value.transpose(0, 1).unsqueeze(0)
    q = query.to(key.dtype)
    folded = _fold_groups(q, kv_heads)
    o_pre, lse_pre = _CPU_FLASH(folded, k[:, :, :prefix], v[:, :, :prefix], scale=scale)[:2]
    own_k = k[:, :, prefix:].repeat_interleave(group, dim=1)
    own_v = v[:, :, prefix:].repeat_interleave(group, dim=1)
    o_own, lse_own = _CPU_FLASH(
        q.transpose(0, 1).unsqueeze(0), own_k, own_v, is_causal=True, scale=scale
    )[:2]
    # Folded rows are (kv head, group member, query): heads in order, as in o_own.
    o_pre = o_pre.reshape(1, heads, n, dim)
    share_pre = torch.sigmoid(lse_pre.reshape(1, heads, n) - lse_own).unsqueeze(-1)
    o = torch.lerp(o_own.float(), o_pre.float(), share_pre)
    return o[0].transpose(0, 1)


def _decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    d: DecodeBatch,
    scale: float,
) -> torch.Tensor:
    """Attention of the decode rows' queries [B, H, D], one per sequence of d.

    In bf16 on a CPU where kernels/cpu_kernels runs (in fp32, kernels/f32_kernels, over
    an fp32, bf16 or int8 cache), its C kernel reads K/V in place
    through the block tables, with no gather and no padding to the longest context
    (several times faster than gathering the blocks for one padded flash call:
    docs/benchmarks.md). Otherwise, one flash-attention call padded to the longest
    context with an additive mask.

    The heads sharing a KV head are that head's query rows, so K/V are never
    repeated for grouped-query attention, and K/V are read through strided views
    of the gathered blocks, never copied again. On CPU this beats two matmuls around
    a softmax over copied K/V, and by far SDPA's masked bf16 path, which takes the
    math fallback (docs/benchmarks.md).
    """
    if _f32_decode_runs(query, k_cache):  # the fp32 paths' own kernel
        return f32_kernels.paged_decode_attention(query.contiguous(), k_cache, v_cache,
                                                  d.tables, d.lens, scale)
    if query.is_cpu and cpu_kernels.runs_decode(k_cache):
        q = query.to(k_cache.dtype).contiguous()
        return cpu_kernels.paged_decode_attention(q, k_cache, v_cache, d.tables, d.lens, scale)
    b = d.tables.shape[0]
    kv_heads, head_dim = k_cache.shape[2], query.shape[2]
    group = query.shape[1] // kv_heads
    # index_select on the flattened table: cheaper than advanced indexing on CPU.
    blocks = d.tables.reshape(-1)
    k = widened(k_cache.index_select(0, blocks), query.dtype)
    v = widened(v_cache.index_select(0, blocks), query.dtype)
    k = k.view(b, -1, kv_heads, head_dim)[:, : d.max_len]
    v = v.view(b, -1, kv_heads, head_dim)[:, : d.max_len]
    q = query.to(k.dtype).view(b, kv_heads, group, head_dim)
    o = _flash(q, k.transpose(1, 2), v.transpose(1, 2), d.mask(k.dtype), scale)
    return o.reshape(b, -1, head_dim)


def own_prefill_runs(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """fp32 queries of a prompt or chunk on a CPU where the own attention (csrc/f32/
    attention.c) has its register tile: twice torch's flash kernel at 512 tokens on a
    Zen 4 (docs/benchmarks.md). Elsewhere torch's kernels."""
    return f32_kernels.tiles_fast() and f32_kernels.runs_prefill_attention(query, k_cache)


def _f32_decode_runs(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether fp32 decode queries take kernels/f32_kernels's C kernel over this cache
    (fp32, or bf16 or int8 widened in registers)."""
    return query.is_cpu and query.dtype == torch.float32 and f32_kernels.runs_decode(k_cache)


def window_applies(meta: AttentionMetadata, window: int | None) -> bool:
    """Whether a sliding window of `window` keys hides any key in this step: only
    once some context is longer than the window (shorter ones take the plain paths)."""
    return window is not None and meta.max_seq_len > window


# A long chunk of a sliding-window layer attends a slice of queries at a time, each
# over its own window: the mask stays a slice's queries x (slice + window) keys.
_WINDOW_QUERY_SLICE = 256


def windowed_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int,
) -> torch.Tensor:
    """Causal sliding-window attention (Gemma's local layers, transformers'
    sliding_window_overlay): the query at position p sees the keys at positions
    p - window + 1 .. p. Every key stays in the cache; the window is a mask.

    Decode rows attend in one padded flash call whose mask hides padding and the keys
    before each row's window; each prefill chunk attends in slices of queries, each
    slice over the blocks its window reaches."""
    out = torch.empty_like(query)
    block_size = k_cache.shape[1]
    kv_heads = k_cache.shape[2]
    group = query.shape[1] // kv_heads
    decode = meta.decode_batch(block_size)
    if decode is not None:
        rows = query.index_select(0, decode.token_idx)
        o = _windowed_decode(rows, k_cache, v_cache, decode, scale, window)
        if decode.all_rows:
            return o.to(query.dtype)
        out.index_copy_(0, decode.token_idx, o.to(out.dtype))
    for i, n in enumerate(meta.query_lens):
        if n == 1:
            continue
        start, length = meta.query_start_loc[i], meta.seq_lens[i]
        table = meta.block_tables[i]
        for first in range(0, n, _WINDOW_QUERY_SLICE):
            m = min(_WINDOW_QUERY_SLICE, n - first)
            p0 = length - n + first  # the slice's first query position
            # Keys from the first block the slice's first window reaches.
            lo = max(0, p0 - window + 1) // block_size * block_size
            hi = p0 + m  # one past the slice's last query position
            blocks = table[lo // block_size : (hi + block_size - 1) // block_size]
            k = widened(k_cache.index_select(0, blocks).flatten(0, 1)[: hi - lo], query.dtype)
            v = widened(v_cache.index_select(0, blocks).flatten(0, 1)[: hi - lo], query.dtype)
            q_pos = torch.arange(p0, hi, device=query.device)[:, None]
            k_pos = torch.arange(lo, hi, device=query.device)[None, :]
            hidden = (k_pos > q_pos) | (k_pos <= q_pos - window)
            mask = torch.zeros(hidden.shape, dtype=k.dtype, device=query.device)
            mask.masked_fill_(hidden, float("-inf"))
            mask = mask.repeat(group, 1)[None, None]  # rows as _fold_groups orders them
            q = query[start + first : start + first + m]
            out[start + first : start + first + m] = _attend_over_prefix(
                q, k, v, mask, scale
            ).to(out.dtype)
    return out


def _windowed_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    d: DecodeBatch,
    scale: float,
    window: int,
) -> torch.Tensor:
    """Attention of the decode rows' queries [B, H, D] over the last `window` keys of
    their contexts: in fp32 on the CPU, kernels/f32_kernels's C kernel (it starts each
    row at its window); otherwise one flash call over the blocks from the earliest
    window start to the longest context, padded, with an additive mask."""
    if _f32_decode_runs(query, k_cache):
        return f32_kernels.paged_decode_attention(query.contiguous(), k_cache, v_cache,
                                                  d.tables, d.lens, scale, window)
    b = d.tables.shape[0]
    block_size, kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], query.shape[2]
    group = query.shape[1] // kv_heads
    first_block = max(0, int(d.lens.min()) - window) // block_size
    tables = d.tables[:, first_block:]
    offset = first_block * block_size  # the position of the gathered keys' first
    span = d.max_len - offset
    blocks = tables.reshape(-1)
    k = widened(k_cache.index_select(0, blocks), query.dtype).view(b, -1, kv_heads, head_dim)
    v = widened(v_cache.index_select(0, blocks), query.dtype).view(b, -1, kv_heads, head_dim)
    k, v = k[:, :span], v[:, :span]
    positions = torch.arange(offset, d.max_len, device=d.lens.device)[None, :]
    hidden = (positions >= d.lens[:, None]) | (positions < d.lens[:, None] - window)
    mask = torch.zeros(hidden.shape, dtype=k.dtype, device=k.device)
    mask = mask.masked_fill_(hidden, float("-inf"))[:, None, None, :]
    q = query.to(k.dtype).view(b, kv_heads, group, head_dim)
    o = _flash(q, k.transpose(1, 2), v.transpose(1, 2), mask, scale)
    return o.reshape(b, -1, head_dim)
