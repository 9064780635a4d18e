"""Single-stream decode over a long context with fp32, bf16 and int8 K/V, on this
process's kernel path (EngineConfig.kv_dtype):

    python -m bench kv-dtype [--weight-dtypes int4] [--contexts 32,512,1024,2048]
        [--new-tokens 64] [--rounds 3] [--out bench-results/kv_dtype.json]

For each weight dtype, an fp32 engine with fp32 K/V, one with bf16 K/V and one with
int8 rows (kernels/kv_quant, its default compact cache); where the path computes in
bf16, the bf16 engine alone. At each context
length, one sequence's prompt of that many tokens is cached first, then a prompt one
token longer decodes --new-tokens greedy tokens: tokens/s after the first, the median
over --rounds rounds in which the engines take turns. Also the KV bytes a token costs.
Set PREFIXCHAT_CPU_PATH (with kernels.cpu_features.LIBRARY_ENV's variables) to measure a
lesser path.
"""

from __future__ import annotations

import random
import statistics

from bench import cli
from bench.engine_runs import decode_figures, engine_config, greedy, run_engine
from bench.report import progress_log, write_json
from inference.llm_engine import LLMEngine
from inference.model_runner import kv_bytes_per_block
from kernels.cpu_features import cpu_path

log = progress_log("bench kv-dtype")

KV_DTYPES = ("float32", "bfloat16", "int8")


def decode_rate(engine: LLMEngine, context: list[int], new_tokens: int) -> float:
    """Decode tokens/s of one sequence over `context` (cached first, as a chat's
    history is) plus one new token."""
    run_engine(engine, [context], greedy(1))
    prompt = [*context, context[-1] ^ 1]
    run = run_engine(engine, [prompt], greedy(new_tokens))
    return decode_figures(1, new_tokens, run.start, run.first_token, run.end)[
        "decode_tokens_per_s"]


def main(argv: list[str] | None = None) -> dict:
    p = cli.parser("kv-dtype", __doc__)
    cli.add(p, "model")
    cli.add(p, "weight_dtypes", "int4")
    p.add_argument("--contexts", default="32,512,1024,2048",
                   help="context lengths, comma-separated (default: %(default)s)")
    cli.add(p, "new_tokens", 64)
    cli.add(p, "rounds", 3)
    cli.add(p, "threads")
    cli.add(p, "out", cli.RESULTS / "kv_dtype.json")
    args = p.parse_args(argv)
    cli.set_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    rng = random.Random(0)
    longest = max(contexts) + args.new_tokens + 1
    blocks = (longest + 15) // 16 + 8
    results = []
    for weight_dtype in args.weight_dtypes.split(","):
        engines = {}
        dtype = cli.engine_dtype("auto")
        # A bf16 engine keeps bf16 K/V only; an fp32 one takes either.
        for kv_dtype in KV_DTYPES if dtype == "float32" else (dtype,):
            config = engine_config(args.model, dtype, blocks, 1, weight_dtype=weight_dtype,
                                   kv_dtype=kv_dtype)
            engines[kv_dtype] = LLMEngine(config)
        rates: dict[tuple[str, int], list[float]] = {}
        for r in range(args.rounds):
            for n in contexts:
                # A fresh context each round, so no round decodes over another's cache.
                context = [rng.randrange(100, 40000) for _ in range(n)]
                for kv_dtype, engine in engines.items():
                    rates.setdefault((kv_dtype, n), []).append(
                        decode_rate(engine, context, args.new_tokens))
            log(f"{weight_dtype}: round {r + 1} of {args.rounds}")
        for (kv_dtype, n), values in rates.items():
            engine = engines[kv_dtype]
            results.append({
                "weight_dtype": engine.config.weight_dtype, "kv_dtype": kv_dtype,
                "context": n, "decode_tokens_per_s": statistics.median(values),
                "rounds": values, "kv_bytes_per_token": kv_bytes_per_block(
                    engine.model_config, 1, engine.runner.kv_dtype)})
        del engines
    print(f"kernel path: {cpu_path()}")
    print(f"{'weights':8s} {'KV':>9s} {'context':>8s} {'decode tok/s':>13s} {'KV B/token':>11s}")
    for r in results:
        print(f"{r['weight_dtype']:8s} {r['kv_dtype']:>9s} {r['context']:8d} "
              f"{r['decode_tokens_per_s']:13.1f} {r['kv_bytes_per_token']:11d}")
    data = {"kind": "kv-dtype", "model": args.model, "cpu_path": cpu_path(),
            "new_tokens": args.new_tokens, "results": results}
    write_json(args.out, data, log)
    return data


if __name__ == "__main__":
    main()
