"""Greedy agreement with llama.cpp on the same GGUF file: how many leading tokens of
our engine's greedy continuation equal llama-server's, prompt by prompt.

    python -m bench agreement [--model gemma3-270m] [--weight-dtypes auto,fp32,int4]
        [--new-tokens 24] [--out bench-results/agreement.json]

Both get the same token ids (the file's BOS, then the prompt's tokens with special
tokens parsed) and generate greedily without stopping at EOS. llama-server is the one
`python -m bench llamacpp build` made, started on the model's own .gguf. The model is
a GGUF our loader names (`gemma3-270m`, the default SmolLM2) or a .gguf path.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import urllib.request
from pathlib import Path

from bench import cli
from bench import llamacpp_build as lb
from bench.report import progress_log, write_json
from bench.servers import ServerSettings, start_llama_server
from inference.loader import gguf_source

log = progress_log("bench agreement")

# A chat turn in the model's own format is added by --chat; plain text suits a base model.
PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colours are",
)


def llama_greedy(url: str, ids: list[int], n: int) -> list[int]:
    body = {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": False}
    request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["tokens"]


def leading_equal(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


def run(args: argparse.Namespace) -> dict:
    from inference import EngineConfig, LLMEngine, SamplingParams

    source = gguf_source(args.model)
    if source is None:
        raise SystemExit(f"{args.model!r} is not a GGUF file this loader knows")
    binary = lb.binary(lb.cache_dir(), "llama-server")
    if not binary.exists():
        raise SystemExit("no llama-server: run `python -m bench llamacpp build` first")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-agreement-") as logs:
        server = start_llama_server(binary, source, "agreement",
                                    ServerSettings(threads=args.threads, ctx=4096, parallel=1),
                                    Path(logs))
        try:
            for kind in args.weight_dtypes.split(","):
                log(f"{kind}: loading")
                engine = LLMEngine(EngineConfig(model=args.model, weight_dtype=kind,
                                                num_threads=args.threads))
                tok = engine.tokenizer
                greedy = SamplingParams(max_tokens=args.new_tokens, temperature=0.0,
                                        ignore_eos=True)
                for prompt in PROMPTS:
                    ids = [tok.bos_token_id, *tok.encode(prompt, add_special_tokens=False)]
                    ours = engine.generate([ids], greedy)[0][0].token_ids
                    theirs = llama_greedy(server.url, ids, args.new_tokens)
                    rows.append({"weight_dtype": kind, "cpu_path": engine.runner.cpu_path,
                                 "prompt": prompt, "leading_equal": leading_equal(ours, theirs),
                                 "of": len(theirs), "ours": tok.decode(ours),
                                 "llama_cpp": tok.decode(theirs)})
                engine.close()
        finally:
            server.stop()
    return {"kind": "agreement", "model": args.model, "gguf": source.name,
            "new_tokens": args.new_tokens, "rows": rows}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("agreement", __doc__)
    cli.add(p, "model", "gemma3-270m")
    cli.add(p, "weight_dtypes", "auto,fp32,int4")
    cli.add(p, "new_tokens", 24)
    cli.add(p, "threads", 2)
    cli.add(p, "out", cli.RESULTS / "agreement.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(f"{'weights':8s} {'path':12s} {'equal':>7s}  prompt")
    for r in result["rows"]:
        print(f"{r['weight_dtype']:8s} {r['cpu_path']:12s} {r['leading_equal']:3d}/{r['of']:<3d}"
              f"  {r['prompt']}")
    write_json(args.out, result, log)
    return result


if __name__ == "__main__":
    main()
