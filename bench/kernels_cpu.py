"""Time the compiled CPU kernels (kernels/cpu_kernels) against the torch ops they
replace, on shapes of SmolLM2 (9 query heads, 3 KV heads, dim 64), bf16:

    python -m bench kernels-cpu [--out bench-results/kernels-cpu.json] [--rounds 5]

- decode: one query per sequence over its paged context; the C kernel reading K/V
  in place, against gathering the blocks and one padded flash call;
- softmax: the causal softmax of a chunk's scores held whole, against the mask
  added over its own keys and torch.softmax;
- rms_norm: RMSNorm of bf16 rows, against torch's rms_norm and the weight multiply.

Each round times both sides back to back; the figures are per-case medians over
rounds, in microseconds per call (one layer, or one norm). Per-call times, not
per-token ones: the engine benchmark (python -m bench) gives those.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from bench import cli
from bench.metrics import median_call_seconds
from bench.report import write_json
from kernels import attention, cpu_kernels
from kernels.attention import AttentionMetadata, paged_attention

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16
DECODE_CASES = [(1, 32), (1, 1000), (32, 32), (32, 200), (16, 1000)]  # (sequences, context)
SOFTMAX_CASES = [(82, 1490), (256, 1024), (82, 82)]  # (queries, context)
RMS_NORM_CASES = [(1, 576), (32, 576), (256, 576)]  # (rows, hidden size)


def decode_case(seqs: int, context: int):
    """A step of decodes over scattered blocks, as paged_attention receives it."""
    g = torch.Generator().manual_seed(seqs * 7919 + context)
    per_seq = -(-context // BLOCK)
    num_blocks = seqs * per_seq + 1
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, generator=g).bfloat16()
    v_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, generator=g).bfloat16()
    tables = torch.randperm(num_blocks - 1, generator=g)[: seqs * per_seq].view(seqs, per_seq)
    # Ragged contexts, as a real batch has: up to 8 tokens shorter than the longest.
    lens = [max(1, context - (i * 3) % 9) for i in range(seqs)]
    meta = AttentionMetadata(torch.full((seqs,), -1), tables, list(range(seqs + 1)), lens)
    q = torch.randn(seqs, HEADS, DIM, generator=g).bfloat16()
    return q, k_cache, v_cache, meta


def time_decode(seqs: int, context: int, iters: int) -> tuple[float, float]:
    q, k_cache, v_cache, meta = decode_case(seqs, context)
    ours = median_call_seconds(lambda: paged_attention(q, k_cache, v_cache, meta, DIM**-0.5), iters)
    runs = cpu_kernels.runs_decode
    cpu_kernels.runs_decode = lambda cache: False  # the gather + flash path
    try:
        torch_ops = median_call_seconds(lambda: paged_attention(q, k_cache, v_cache, meta, DIM**-0.5), iters)
    finally:
        cpu_kernels.runs_decode = runs
    return ours, torch_ops


def time_softmax(n: int, context: int, iters: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(n * 31 + context)
    group = HEADS // KV_HEADS
    scores = (torch.randn(KV_HEADS, group * n, context, generator=g) * 4).bfloat16()
    mask = AttentionMetadata(torch.zeros(n), torch.zeros(1, 1), [0, n], [context]).chunk_mask(
        n, group, torch.bfloat16
    )
    work = scores.clone()

    def ours() -> None:
        work.copy_(scores)
        cpu_kernels.causal_softmax_(work, n)

    def torch_ops() -> None:
        work.copy_(scores)
        work[:, :, context - n :].add_(mask)
        torch.softmax(work, dim=-1)

    return median_call_seconds(ours, iters), median_call_seconds(torch_ops, iters)


def time_rms_norm(rows: int, dim: int, iters: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(rows * 13 + dim)
    x = (torch.randn(rows, dim, generator=g) * 3).bfloat16()
    weight = (torch.randn(dim, generator=g) * 0.3 + 1).bfloat16()
    ours = median_call_seconds(lambda: cpu_kernels.rms_norm(x, weight, 1e-5), iters)
    torch_ops = median_call_seconds(lambda: weight * F.rms_norm(x, (dim,), eps=1e-5), iters)
    return ours, torch_ops


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("kernels-cpu", __doc__)
    cli.add(parser, "out", cli.RESULTS / "kernels-cpu.json")
    cli.add(parser, "rounds", 5)
    cli.add(parser, "iters", 30)
    args = parser.parse_args(argv)
    if not cpu_kernels.available():
        raise SystemExit("the compiled CPU kernels don't run here (AVX512-BF16 and a C compiler)")
    cases = [("decode", s, c, time_decode) for s, c in DECODE_CASES]
    cases += [("softmax", n, c, time_softmax) for n, c in SOFTMAX_CASES]
    cases += [("rms_norm", r, d, time_rms_norm) for r, d in RMS_NORM_CASES]
    rounds: dict[str, list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for kind, a, b, fn in cases:
            rounds.setdefault(f"{kind} {a}x{b}", []).append(fn(a, b, args.iters))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    results = []
    for name, pairs in rounds.items():
        ours = statistics.median(p[0] for p in pairs) * 1e6
        torch_us = statistics.median(p[1] for p in pairs) * 1e6
        speedup = statistics.median(p[1] / p[0] for p in pairs)
        results.append({"case": name, "c_us": ours, "torch_us": torch_us, "speedup": speedup})
        print(f"{name:18s} C {ours:8.1f} us   torch {torch_us:8.1f} us   x{speedup:.2f}")
    out = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "held_whole_dtypes": sorted(str(d) for d in attention._HELD_WHOLE_DTYPES),
        "rounds": args.rounds,
        "cases": results,
    }
    write_json(args.out, out)


if __name__ == "__main__":
    main()
