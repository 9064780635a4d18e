"""Real model sizes: random-weight GGUFs of the Llama 3.2 1B, 3B, Llama 3.1 8B and
Qwen2.5 1.5B shapes (bench/random_gguf.py, no download), served by our engine and by
llama.cpp's llama-server on the same file, same threads.

    python -m bench model-sizes [--shapes llama-3.2-1b,...] [--mixes Q4_K_M,Q8_0]
        [--new-tokens 32] [--tokens 512] [--threads 2] [--no-llamacpp] [--isa avx2]

Per file: ours at first start (its model cache emptied) and at a later start (time to
a ready engine, peak and steady resident memory), single-stream decode (tokens/s after
the first), a cold prompt's time to first token; llama-server's start (to /health),
memory, decode and prompt time from its own timings. Decode is also given as a share
of the memory-bandwidth roofline: the bytes of weights a token reads times tokens/s
over this host's read bandwidth (torch summing 1 GiB on the same threads); a cold
prompt as GFLOP/s against torch's fp32 GEMM on the same threads (2 n params flops a
token, attention left out). Each engine runs in its own process, so resident memory
is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench import cli, random_gguf
from bench.report import progress_log, write_json

log = progress_log("bench model-sizes")
ROOT = Path(__file__).resolve().parents[1]


def _status(pid: int | str = "self") -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM", "VmRSS")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) * 1024
    return out


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1000, min(vocab, 40000)) for _ in range(n)]


def run_ours(model: str, cache: str, decode: int, prompt: int, threads: int) -> dict:
    """One start of our engine in this process, and its figures (the child's job)."""
    started = time.perf_counter()
    from inference.config import EngineConfig
    from inference.llm_engine import LLMEngine
    from inference.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, model_cache_dir=cache, num_threads=threads,
                                    max_model_len=4096))
    ready = time.perf_counter() - started
    at_start = _status()
    vocab = engine.vocab_size
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    t = time.perf_counter()
    engine.generate([_prompt(8, vocab, 1)], params)
    first = time.perf_counter() - t
    params = SamplingParams(max_tokens=decode + 1, temperature=0, ignore_eos=True)
    t = time.perf_counter()
    engine.generate([_prompt(8, vocab, 2)], params)
    decode_s = time.perf_counter() - t - first
    t = time.perf_counter()
    engine.generate([_prompt(prompt, vocab, 3)], SamplingParams(max_tokens=1, temperature=0))
    cold = time.perf_counter() - t
    model_ = engine.runner.model
    read = sum(m.quantized.nbytes if m.quantized is not None else m.weight.nbytes
               for m in model_.linear_layers().values())
    params_n = sum(m.out_features * m.in_features for m in model_.linear_layers().values())
    return {"start_s": ready, "rss_start": at_start["VmRSS"], "peak_rss": _status()["VmHWM"],
            "steady_rss": _status()["VmRSS"], "decode_tok_s": decode / decode_s,
            "cold_ttft_s": cold, "weight_bytes_per_token": read, "matmul_params": params_n,
            "kv_pool_bytes": engine.runner.kv_cache.nbytes, "cpu_path": engine.cpu_path,
            "weight_dtype": engine.config.weight_dtype}


def ours(path: Path, cache: Path, args, first: bool) -> dict:
    if first:
        shutil.rmtree(cache, ignore_errors=True)
    out = cache.parent / f"{path.stem}.ours.json"
    cmd = [sys.executable, "-m", "bench.model_sizes", "--_child", str(path), "--_cache",
           str(cache), "--_out", str(out), "--new-tokens", str(args.new_tokens), "--tokens",
           str(args.tokens), "--threads", str(args.threads)]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "LLM_PRELOAD": "0"})
    return json.loads(out.read_text())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as response:
        return json.loads(response.read())


def llamacpp(path: Path, args, logs: Path) -> dict:
    from bench import llamacpp_build as lb
    from bench.servers import ServerSettings, start_llama_server

    binary = lb.binary(lb.cache_dir(None), "llama-server", isa=args.isa)
    settings = ServerSettings(threads=args.threads, ctx=4096, parallel=1)
    server = start_llama_server(binary, path, path.stem, settings, logs)
    try:
        pid = server.proc.pid
        at_start = _status(pid)
        vocab = random_gguf.SHAPES[args.shape_of[path]].vocab
        body = {"n_predict": args.new_tokens + 1, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False}
        done = _post(server.url + "/completion", {**body, "prompt": _prompt(8, vocab, 2)})
        decode = done["timings"]["predicted_per_second"]
        done = _post(server.url + "/completion", {**body, "n_predict": 1,
                                                  "prompt": _prompt(args.tokens, vocab, 3)})
        cold = done["timings"]["prompt_ms"] / 1000
        end = _status(pid)
        return {"start_s": server.startup_s, "rss_start": at_start["VmRSS"],
                "peak_rss": end["VmHWM"], "steady_rss": end["VmRSS"], "decode_tok_s": decode,
                "cold_ttft_s": cold}
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)


def host_rates(threads: int) -> dict:
    """This host's read bandwidth and fp32 GEMM rate on `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    a = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB
    best = min(_timed(a.sum) for _ in range(5))
    m = torch.randn(2048, 2048)
    gemm = min(_timed(lambda: m @ m) for _ in range(5))
    return {"read_bytes_s": a.nbytes / best, "sgemm_flops_s": 2 * 2048**3 / gemm}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def table(rows: list[dict]) -> str:
    head = ("| file | engine | first start | later start | peak RSS | file + KV | decode tok/s "
            "(roofline) | cold prompt | GFLOP/s |\n|---|---|---|---|---|---|---|---|---|")
    out = [head]
    for r in rows:
        for name in ("ours", "llama.cpp"):
            e = r.get(name)
            if not e:
                continue
            first = e.get("first_start_s")
            roof = e.get("roofline")
            out.append(
                f"| {r['file']} | {name} | {first:.1f} s | " if first is not None
                else f"| {r['file']} | {name} | - | ")
            out[-1] += (f"{e['start_s']:.1f} s | {e['peak_rss'] / 2**30:.2f} GiB | "
                        f"{r['budget_bytes'] / 2**30:.2f} GiB | {e['decode_tok_s']:.2f}"
                        + (f" ({roof:.0%})" if roof else "")
                        + f" | {e['cold_ttft_s']:.1f} s | "
                        + (f"{e['gflops']:.0f}" if e.get("gflops") else "-") + " |")
        if r.get("ours") and r.get("llama.cpp"):
            o, ll = r["ours"], r["llama.cpp"]
            out.append(f"| {r['file']} | ratio | | | | | {o['decode_tok_s'] / ll['decode_tok_s']:.2f}x"
                       f" | {o['cold_ttft_s'] / ll['cold_ttft_s']:.2f}x | |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict | None:
    parser = cli.parser("model-sizes", __doc__)
    parser.add_argument("--shapes", default="llama-3.2-1b,llama-3.2-3b,llama-3.1-8b",
                        help=f"shapes of {', '.join(random_gguf.SHAPES)} (default: %(default)s)")
    parser.add_argument("--mixes", default="Q4_K_M,Q8_0", help="GGUF types (default: %(default)s)")
    cli.add(parser, "new_tokens", 32)
    cli.add(parser, "prompt_tokens", 512)
    cli.add(parser, "server_threads")
    parser.add_argument("--dir", default=str(Path.home() / ".cache/prefixchat/model-sizes"),
                        help="where the files and our model caches are kept (default: %(default)s)")
    parser.add_argument("--no-llamacpp", action="store_true", help="ours only")
    parser.add_argument("--isa", default="native", help="which llama.cpp build (native, avx2)")
    cli.add(parser, "out", Path("artifacts/bench/model_sizes.json"))
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_cache", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:  # one start of ours, in its own process
        result = run_ours(args._child, args._cache, args.new_tokens, args.tokens, args.threads)
        Path(args._out).write_text(json.dumps(result))
        return None
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    rates = host_rates(args.threads)
    log(f"read bandwidth {rates['read_bytes_s'] / 1e9:.1f} GB/s, fp32 GEMM "
        f"{rates['sgemm_flops_s'] / 1e9:.0f} GFLOP/s on {args.threads} threads")
    args.shape_of = {}
    rows = []
    for shape_name in args.shapes.split(","):
        shape = random_gguf.SHAPES[shape_name]
        for mix in args.mixes.split(","):
            path = folder / f"{shape_name}-{mix}.gguf"
            if not path.exists():
                log(f"writing {path.name}")
                random_gguf.write(path, shape, mix)
            args.shape_of[path] = shape_name
            row = {"file": path.name, "file_bytes": path.stat().st_size}
            cache = folder / f"cache-{path.stem}"
            log(f"{path.name}: ours, first start")
            first = ours(path, cache, args, first=True)
            log(f"{path.name}: ours, later start")
            later = ours(path, cache, args, first=False)
            later["first_start_s"] = first["start_s"]
            later["first_peak_rss"] = first["peak_rss"]
            later["peak_rss"] = max(first["peak_rss"], later["peak_rss"])
            later["roofline"] = (later["weight_bytes_per_token"] * later["decode_tok_s"]
                                 / rates["read_bytes_s"])
            later["gflops"] = 2 * later["matmul_params"] * args.tokens / later["cold_ttft_s"] / 1e9
            row["ours"] = later
            row["budget_bytes"] = row["file_bytes"] + later["kv_pool_bytes"]
            if not args.no_llamacpp:
                log(f"{path.name}: llama.cpp")
                ll = llamacpp(path, args, folder)
                ll["gflops"] = (2 * later["matmul_params"] * args.tokens / ll["cold_ttft_s"] / 1e9)
                row["llama.cpp"] = ll
            rows.append(row)
            print(table([row]), flush=True)
    result = {"host": rates, "threads": args.threads, "decode": args.new_tokens,
              "prompt": args.tokens, "rows": rows,
              "cpu_path": rows[0]["ours"]["cpu_path"] if rows else None}
    print(table(rows))
    write_json(args.out, result, log)
    return result


if __name__ == "__main__":
    main()
