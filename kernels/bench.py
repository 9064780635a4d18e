"""Time the attention kernels on CUDA: Triton vs the torch reference vs SDPA.

    python -m kernels.bench [--out bench-results/kernels.json]

Runs the kernel tests first (natively, not interpreted), then times decode and
prefill-over-cache batches shaped like SmolLM2 (9 query heads, 3 KV heads, dim 64).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels import attention as reference
from kernels.attention import AttentionMetadata, gather_kv


def _batch(num_seqs: int, ctx: int, q_len: int, dtype, bs: int = 16, heads=(9, 3), dim=64):
    nb = -(-ctx // bs)
    k_cache = torch.randn(num_seqs * nb + 1, bs, heads[1], dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_seqs * nb, device="cuda").view(num_seqs, nb)
    qsl = [i * q_len for i in range(num_seqs + 1)]
    meta = AttentionMetadata(torch.zeros(num_seqs * q_len, dtype=torch.long, device="cuda"),
                             perm, qsl, [ctx] * num_seqs)
    q = torch.randn(num_seqs * q_len, heads[0], dim, dtype=dtype, device="cuda")
    return q, k_cache, v_cache, meta


def _sdpa_gathered(q, k_cache, v_cache, meta, scale):
    """SDPA on K/V gathered per sequence: the usual non-paged baseline."""
    outs = []
    for i, n in enumerate(meta.query_lens):
        s, L = meta.query_start_loc[i], meta.seq_lens[i]
        k = gather_kv(k_cache, meta.block_tables[i], L).transpose(0, 1)[None]
        v = gather_kv(v_cache, meta.block_tables[i], L).transpose(0, 1)[None]
        qi = q[s : s + n].transpose(0, 1)[None]
        mask = torch.arange(L, device=q.device)[None, :] <= torch.arange(L - n, L, device=q.device)[:, None]
        outs.append(F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale,
                                                   enable_gqa=True)[0].transpose(0, 1))
    return torch.cat(outs)


def _time_ms(fn, iters: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench-results/kernels.json")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernels.bench needs a CUDA device")
    from kernels import triton_attention

    result: dict = {"device": torch.cuda.get_device_name(), "cases": []}
    if not args.skip_tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/kernels"])
        result["kernel_tests_passed"] = tests.returncode == 0
    for name, seqs, ctx, q_len in [
        ("decode", 32, 1024, 1), ("decode", 64, 4096, 1),
        ("prefill_over_cache", 4, 2048, 512), ("prefill", 4, 512, 512),
    ]:
        for dtype in (torch.bfloat16, torch.float16):
            batch = (*_batch(seqs, ctx, q_len, dtype), 64**-0.5)
            case = {"case": name, "seqs": seqs, "context": ctx, "query_len": q_len,
                    "dtype": str(dtype).removeprefix("torch.")}
            for key, fn, iters in [
                ("triton_ms", triton_attention.paged_attention, 50),
                ("reference_ms", reference.paged_attention, 10),
                ("sdpa_gathered_ms", _sdpa_gathered, 10),
            ]:
                case[key] = _time_ms(functools.partial(fn, *batch), iters)
            result["cases"].append(case)
            print(json.dumps(case))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
