"""Weight-only quantization on CPU: single-stream decode of SmolLM2 with bf16, int8
and int4 linear weights, and the per-call time of each matmul path:

    python -m bench quant [--rounds 3] [--new-tokens 64] [--out bench-results/quant.json]

- decode: one sequence, greedy, tokens/s after the first token; the three engines
  take turns within each round, so host noise lands on all of them; medians over
  rounds. Also one uncached prefill of --prefill-tokens tokens (which dequantizes
  every weight once per step).
- kernels: x [rows, in] times W [out, in] for SmolLM2's shapes (576 -> 1536,
  1536 -> 576, and the 576 -> 49152 output head) at 1, 4 and 8 rows: bf16 through
  oneDNN with a packed weight (what more than 8 rows take), the C bf16 matmul (what
  decode rows take), the int8 and int4 C kernels, and dequantizing then multiplying
  (what more than 8 rows do); microseconds per call, medians over rounds.
"""

from __future__ import annotations

import statistics

import torch

from bench import cli
from bench.engine_runs import decode_figures, engine_config, greedy, run_engine
from bench.metrics import median_call_seconds
from bench.report import write_json
from inference import LLMEngine
from kernels import cpu_kernels
from kernels import quant_linear as ql
from kernels.cpu_features import has_native_bf16
from kernels.cpu_linear import linear, pack_weight, packed_linear

WEIGHT_DTYPES = ("bf16", "int8", "int4")
SHAPES = [(576, 1536), (1536, 576), (576, 49152)]  # (in, out)
ROWS = (1, 4, 8)
PROMPT = "Write a long story about a lighthouse keeper and the ships that pass."


def kernel_cases() -> dict[str, dict]:
    """name -> {path: callable} for each shape and row count."""
    cases = {}
    for inp, out in SHAPES:
        w = torch.randn(out, inp, generator=torch.Generator().manual_seed(out)) / inp**0.5
        wb = w.bfloat16()
        packed = pack_weight(wb, 32)
        # The path's activations: bf16 on avx512-bf16 (quantized kinds beside plain bf16),
        # fp32 elsewhere (every stored kind, bf16 among them, beside plain fp32).
        bf16 = has_native_bf16()
        kinds = ql.QUANT_KINDS if bf16 else ql.KINDS
        quantized = {kind: ql.quantize(w, kind) for kind in kinds}
        for rows in ROWS:
            x = torch.randn(rows, inp).to(torch.bfloat16 if bf16 else torch.float32)
            if bf16:
                paths = {
                    "bf16": (lambda x=x, p=packed: packed_linear(x, p, None))
                    if packed is not None else (lambda x=x, w=wb: linear(x, w)),
                }
            else:
                paths = {"fp32": lambda x=x, w=w: linear(x, w)}
            if cpu_kernels.runs_bf16_matmul(x, wb):  # the decode step's own bf16 matmul
                paths["bf16-c"] = lambda x=x, w=wb: cpu_kernels.bf16_matmul(x, w)
            for kind, qw in quantized.items():
                if ql.runs_kernel(x, qw):
                    paths[kind] = lambda x=x, qw=qw: ql.kernel_matmul(x, qw)
                paths[f"{kind}-dequant"] = lambda x=x, qw=qw: ql.dequant_linear(x, qw)
            cases[f"{inp}->{out} x{rows}"] = paths
    return cases


def decode_prompt(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}],
                                         add_generation_prompt=True, return_dict=False)


def main(argv: list[str] | None = None) -> dict:
    parser = cli.parser("quant", __doc__)
    cli.add(parser, "rounds", 3)
    cli.add(parser, "new_tokens", 64)
    cli.add(parser, "iters", 30)
    cli.add(parser, "threads")
    cli.add(parser, "model")
    parser.add_argument("--prefill-tokens", type=cli.positive_int, default=256,
                        help="tokens of the one uncached prefill (default: %(default)s)")
    cli.add(parser, "out", cli.RESULTS / "quant.json")
    args = parser.parse_args(argv)
    cli.set_threads(args.threads)

    engines = {
        wd: LLMEngine(engine_config(args.model, "auto", num_blocks=64, max_num_seqs=1,
                                    weight_dtype=wd))
        for wd in WEIGHT_DTYPES
    }
    tokenizer = engines["bf16"].tokenizer
    prompt = decode_prompt(tokenizer)
    # A long prompt of plain text, cut to size: one uncached prefill.
    long_prompt = (tokenizer.encode(PROMPT + " ") * args.prefill_tokens)[: args.prefill_tokens]
    cases = kernel_cases()
    decode: dict[str, list[float]] = {wd: [] for wd in WEIGHT_DTYPES}
    prefill: dict[str, list[float]] = {wd: [] for wd in WEIGHT_DTYPES}
    calls: dict[str, dict[str, list[float]]] = {c: {p: [] for p in paths} for c, paths in cases.items()}
    for r in range(args.rounds):
        order = WEIGHT_DTYPES[r % 3:] + WEIGHT_DTYPES[: r % 3]
        for wd in order:
            engine = engines[wd]
            engine.reset_prefix_cache()
            run_engine(engine, [prompt], greedy(4))  # warm
            engine.reset_prefix_cache()
            run = run_engine(engine, [prompt], greedy(args.new_tokens))
            fig = decode_figures(1, args.new_tokens, run.start, run.first_token, run.end)
            decode[wd].append(fig["decode_tokens_per_s"])
            engine.reset_prefix_cache()
            run = run_engine(engine, [long_prompt], greedy(1))
            prefill[wd].append(len(long_prompt) / (run.end - run.start))
        for case, paths in cases.items():
            for path, fn in paths.items():
                calls[case][path].append(median_call_seconds(fn, args.iters) * 1e6)
        print(f"round {r + 1}/{args.rounds}: decode tokens/s "
              + ", ".join(f"{wd} {decode[wd][-1]:.1f}" for wd in WEIGHT_DTYPES), flush=True)

    result = {
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(prompt),
        "kernels_available": cpu_kernels.quant_available(),
        "decode_tokens_per_s": {wd: statistics.median(v) for wd, v in decode.items()},
        "decode_tokens_per_s_rounds": decode,
        "prefill_tokens": len(long_prompt),
        "prefill_tokens_per_s": {wd: statistics.median(v) for wd, v in prefill.items()},
        "weight_bytes": {
            wd: sum(
                m.quantized.nbytes if m.quantized is not None
                else m.in_features * m.out_features * e.runner.dtype.itemsize
                for m in e.runner.model.linear_layers().values()
            )
            for wd, e in engines.items()
        },
        "per_call_us": {c: {p: statistics.median(v) for p, v in d.items()} for c, d in calls.items()},
    }
    print(f"\nsingle-stream decode, tokens/s (median of {args.rounds}, "
          f"{result['threads']} threads, {args.new_tokens} new tokens):")
    for wd in WEIGHT_DTYPES:
        print(f"  {wd:5s} {result['decode_tokens_per_s'][wd]:7.1f}   "
              f"linear weights {result['weight_bytes'][wd] / 2**20:6.1f} MiB   "
              f"prefill of {len(long_prompt)} tokens "
              f"{result['prefill_tokens_per_s'][wd]:7.1f} tokens/s")
    paths = list(next(iter(cases.values())))
    print("\nper call, microseconds (median):")
    print(f"  {'case':20s}" + "".join(f"{p:>14s}" for p in paths))
    for case, d in result["per_call_us"].items():
        print(f"  {case:20s}" + "".join(f"{d[p]:14.1f}" for p in paths))
    write_json(args.out, result)
    return result
