"""Time the fp32 prefill's own kernels (kernels/csrc/f32/gemm.c and attention.c)
against torch's, on this CPU's path, with SmolLM2's shapes (hidden 576, 9 query
heads over 3 KV heads of 64):

    python -m bench prefill-cpu [--tokens 512] [--rounds 5] [--iters 10]
        [--out bench-results/prefill-cpu.json]

- gemm: the prompt's rows times each layer's weight as int8 (uint8 layers) and
  int4 store it: the own GEMM, dequantizing as it goes, against F.linear (MKL's
  sgemm) over tiles dequantized to memory; GFLOP/s;
- attention: the prompt's causal attention over an int8-row cache: the own kernel
  against gathering, widening and torch's CPU flash kernel;
- prefill: a cold prompt of --tokens tokens through the engine in process (int8 and
  int4 weights, the default int8 K/V rows), with torch's kernels, each own kernel
  alone, and both (what this CPU takes by default is in the JSON's `defaults`).

Each round times every case back to back; figures are per-case medians over rounds.
Run it on the path to measure: PREFIXCHAT_CPU_PATH=avx2 with the library caps of
`make test-avx2` for the AVX2 path on an AVX512 host.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from bench import cli
from bench.metrics import median_call_seconds
from bench.report import write_json
from kernels import attention, f32_kernels, kv_quant
from kernels import quant_linear as ql
from kernels.attention import AttentionMetadata, gather_kv, widened
from kernels.cpu_features import cpu_path, cpu_vendor

HIDDEN, HEADS, KV_HEADS, DIM, BLOCK = 576, 9, 3, 64, 16
# (out, in) of a SmolLM2-135M layer's matmuls: fused qkv, o, fused gate/up, down.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
KINDS = ("uint8", "int4")
CHOICES = {"torch": ("torch", False), "own gemm": ("own", False),
           "own attention": ("torch", True), "own both": ("own", True)}


@contextmanager
def prefill_kernels(gemm: str, own_attention: bool) -> Iterator[None]:
    """The engine's prefill takes `gemm` ("own" or "torch") and, or not, the own
    attention, for the duration."""
    choose, runs = ql.prefill_gemm, attention.own_prefill_runs
    ql.prefill_gemm = lambda: gemm
    if not own_attention:
        attention.own_prefill_runs = lambda query, k_cache: False
    try:
        yield
    finally:
        ql.prefill_gemm, attention.own_prefill_runs = choose, runs


def time_gemm(kind: str, out: int, inp: int, rows: int, iters: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(out * 7 + inp)
    qw = ql.quantize(torch.randn(out, inp, generator=g) / inp**0.5, kind)
    x = torch.randn(rows, inp, generator=g)
    own = median_call_seconds(lambda: f32_kernels.gemm(x, kind, qw.data, qw.scale, inp), iters)
    with prefill_kernels("torch", False):
        torch_s = median_call_seconds(lambda: ql.dequant_linear(x, qw), iters)
    return own, torch_s


def attention_case(tokens: int):
    """A prompt of `tokens` tokens stored in an int8-row cache, as paged_attention gets it."""
    g = torch.Generator().manual_seed(tokens)
    blocks = -(-tokens // BLOCK)
    k_cache = torch.zeros(blocks, BLOCK, KV_HEADS, kv_quant.pool_last_axis(DIM, kv_quant.POOL_DTYPE),
                          dtype=kv_quant.POOL_DTYPE)
    v_cache = torch.zeros_like(k_cache)
    f32_kernels.store_kv(torch.randn(tokens, KV_HEADS, DIM, generator=g),
                         torch.randn(tokens, KV_HEADS, DIM, generator=g), k_cache, v_cache,
                         torch.arange(tokens))
    table = torch.arange(blocks)
    meta = AttentionMetadata(torch.arange(tokens), table[None], [0, tokens], [tokens])
    return torch.randn(tokens, HEADS, DIM, generator=g), k_cache, v_cache, table, meta


def time_attention(tokens: int, iters: int) -> tuple[float, float]:
    q, k_cache, v_cache, table, _ = attention_case(tokens)
    own = median_call_seconds(
        lambda: f32_kernels.prefill_attention(q, k_cache, v_cache, table, tokens, DIM**-0.5), iters)

    def torch_flash() -> torch.Tensor:  # what paged_attention does without the own kernel
        k = widened(gather_kv(k_cache, table, tokens), torch.float32)
        v = widened(gather_kv(v_cache, table, tokens), torch.float32)
        return F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0), is_causal=True, scale=DIM**-0.5, enable_gqa=True)

    return own, median_call_seconds(torch_flash, iters)


def prompt_timer(weight_dtype: str, tokens: int) -> Callable[[], float]:
    """Seconds to the first token of a fresh random prompt on an engine of weight_dtype."""
    from inference.config import EngineConfig
    from inference.llm_engine import LLMEngine
    from inference.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(weight_dtype=weight_dtype,
                                    num_threads=torch.get_num_threads()))
    rng = random.Random(tokens)
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def ttft() -> float:
        prompt = [rng.randrange(100, 40000) for _ in range(tokens)]
        start = time.perf_counter()
        engine.generate([prompt], params)
        return time.perf_counter() - start

    ttft()
    return ttft


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("prefill-cpu", __doc__)
    cli.add(parser, "out", cli.RESULTS / "prefill-cpu.json")
    cli.add(parser, "rounds", 5)
    cli.add(parser, "iters", 10)
    cli.add(parser, "prompt_tokens", 512)
    args = parser.parse_args(argv)
    if not f32_kernels.available():
        raise SystemExit("the fp32 CPU kernels don't run here (no C compiler)")
    timers = {wd: prompt_timer(wd, args.tokens) for wd in ("int8", "int4")}
    kernel_rounds: dict[str, list[tuple[float, float]]] = {}
    prefill_rounds: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for kind in KINDS:
            for out, inp in SHAPES:
                kernel_rounds.setdefault(f"gemm {kind} {out}x{inp}", []).append(
                    time_gemm(kind, out, inp, args.tokens, args.iters))
        kernel_rounds.setdefault(f"attention {args.tokens}", []).append(
            time_attention(args.tokens, args.iters))
        for wd, ttft in timers.items():
            for name, (gemm, own_attention) in CHOICES.items():
                with prefill_kernels(gemm, own_attention):
                    prefill_rounds.setdefault(f"{wd}, {name}", []).append(ttft())
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    kernels = []
    for name, pairs in kernel_rounds.items():
        own, other = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        row = {"case": name, "own_ms": own * 1e3, "torch_ms": other * 1e3,
               "speedup": statistics.median(p[1] / p[0] for p in pairs)}
        if name.startswith("gemm"):
            out, inp = map(int, name.split()[-1].split("x"))
            flop = 2 * args.tokens * out * inp
            row.update(own_gflops=flop / own / 1e9, torch_gflops=flop / other / 1e9)
        kernels.append(row)
        print(f"{name:28s} own {own * 1e3:7.2f} ms   torch {other * 1e3:7.2f} ms   "
              f"x{row['speedup']:.2f}")
    prefills = []
    for name, times in prefill_rounds.items():
        prefills.append({"case": name, "median_ms": statistics.median(times) * 1e3,
                         "min_ms": min(times) * 1e3})
        print(f"prefill {args.tokens}, {name:22s} {statistics.median(times) * 1e3:7.0f} ms")
    write_json(args.out, {
        "kernel_path": cpu_path(),
        "cpu_vendor": cpu_vendor(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tokens": args.tokens,
        "rounds": args.rounds,
        "defaults": {"gemm": ql.prefill_gemm(), "own_attention": f32_kernels.tiles_fast()},
        "kernels": kernels,
        "prefills": prefills,
    })


if __name__ == "__main__":
    main()
