"""Time the attention kernels on CUDA: Triton vs the torch reference vs SDPA.

    python -m bench kernels-cuda [--out bench-results/kernels.json] [--skip-tests] [--quick]

Runs the kernel tests first (natively, not interpreted), then times decode and
prefill-over-cache batches shaped like SmolLM2 (9 query heads, 3 KV heads, dim 64),
and records how far each result is from the reference. `--device cpu` runs the same
script on the CPU, where Triton needs TRITON_INTERPRET=1: a check of the script,
not a measurement.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from bench import cli
from bench.report import write_json
from kernels import attention as reference
from kernels.attention import AttentionMetadata, gather_kv

# (case, sequences, context, query tokens per sequence)
CASES = [
    ("decode", 32, 1024, 1),
    ("decode", 64, 4096, 1),
    ("prefill_over_cache", 4, 2048, 512),
    ("prefill", 4, 512, 512),
]
QUICK_CASES = [("decode", 3, 40, 1), ("prefill_over_cache", 2, 40, 8), ("prefill", 2, 16, 16)]


def _batch(num_seqs: int, ctx: int, q_len: int, dtype, device, bs: int = 16, heads=(9, 3), dim=64):
    nb = -(-ctx // bs)
    k_cache = torch.randn(num_seqs * nb + 1, bs, heads[1], dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_seqs * nb, device=device).view(num_seqs, nb)
    qsl = [i * q_len for i in range(num_seqs + 1)]
    meta = AttentionMetadata(
        torch.zeros(num_seqs * q_len, dtype=torch.long, device=device), perm, qsl, [ctx] * num_seqs
    )
    q = torch.randn(num_seqs * q_len, heads[0], dim, dtype=dtype, device=device)
    return q, k_cache, v_cache, meta


def _sdpa_gathered(q, k_cache, v_cache, meta, scale):
    """SDPA on K/V gathered per sequence: the usual non-paged baseline."""
    outs = []
    for i, n in enumerate(meta.query_lens):
        s, L = meta.query_start_loc[i], meta.seq_lens[i]
        k = gather_kv(k_cache, meta.block_tables[i], L).transpose(0, 1)[None]
        v = gather_kv(v_cache, meta.block_tables[i], L).transpose(0, 1)[None]
        qi = q[s : s + n].transpose(0, 1)[None]
        positions = torch.arange(L, device=q.device)
        mask = positions[None, :] <= torch.arange(L - n, L, device=q.device)[:, None]
        outs.append(
            F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale, enable_gqa=True)[
                0
            ].transpose(0, 1)
        )
    return torch.cat(outs)


def _time_ms(fn, iters: int, device: str) -> float:
    """Mean milliseconds per call: CUDA events on a GPU, the wall clock elsewhere."""
    fn()
    if device != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv: list[str] | None = None) -> dict:
    parser = cli.parser("kernels-cuda", __doc__)
    cli.add(parser, "out", cli.RESULTS / "kernels.json")
    parser.add_argument("--skip-tests", action="store_true", help="do not run tests/kernels first")
    cli.add(parser, "quick")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench kernels-cuda needs a CUDA device")
    from kernels import triton_attention

    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    result: dict = {"device": name, "cases": []}
    if not args.skip_tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/kernels"])
        result["kernel_tests_passed"] = tests.returncode == 0
    iters = (1, 1) if args.quick else (50, 10)
    for case_name, seqs, ctx, q_len in QUICK_CASES if args.quick else CASES:
        for dtype in (torch.bfloat16, torch.float16):
            batch = (*_batch(seqs, ctx, q_len, dtype, args.device), 64**-0.5)
            case = {
                "case": case_name,
                "seqs": seqs,
                "context": ctx,
                "query_len": q_len,
                "dtype": str(dtype).removeprefix("torch."),
            }
            want = reference.paged_attention(*batch).float()
            for key, fn, n in [
                ("triton", triton_attention.paged_attention, iters[0]),
                ("reference", reference.paged_attention, iters[1]),
                ("sdpa_gathered", _sdpa_gathered, iters[1]),
            ]:
                call = functools.partial(fn, *batch)
                case[f"{key}_ms"] = _time_ms(call, n, args.device)
                if key != "reference":
                    case[f"{key}_max_abs_diff"] = (call().float() - want).abs().max().item()
            result["cases"].append(case)
            print(json.dumps(case))
    write_json(args.out, result)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
