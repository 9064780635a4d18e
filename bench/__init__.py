"""Benchmarks: commands that print numbers and write JSON (and PNG plots).

    python -m bench [engine] ...        our engine against transformers:
                                        prefill, decode at 1 and 32, two turns
    python -m bench multiturn [--quick] the chat workload in-process: our engine
                                        with and without prefix caching, and
                                        transformers' generate
    python -m bench offload [--quick]   the host/disk KV tier: a small pool with the
                                        tier off and on against an unbounded pool, a
                                        restart on kv_dir, restore vs recompute
    python -m bench serve --url URL     the chat workloads against any
                                        OpenAI-compatible server over HTTP
    python -m bench plot A.json B.json  TTFT by turn of several runs in one PNG
    python -m bench kernels-cpu         the C kernels against the torch ops they replace
    python -m bench prefill-cpu         the fp32 prefill's own GEMM and attention against
                                        torch's kernels, and a cold prompt with each
    python -m bench prefill-batch       32 short prompts in one step: attention batched
                                        or per sequence, and transformers' padded batch
    python -m bench shared-prefix       16 new chats on one system prompt at once: turn-0
                                        TTFT on a fresh engine against a warm one
    python -m bench kernels-cuda        the Triton kernels on a CUDA device
    python -m bench quant               single-stream decode with bf16, int8 and int4
                                        linear weights, and each quantized matmul's time
    python -m bench quant-quality       how far int8, int4 (and fp32) move the model
                                        from bf16: greedy agreement, log-prob, KL
    python -m bench llamacpp build|compare  llama.cpp's llama-server built here, and
                                        our server against it on the same workloads
    python -m bench memory              our server's resident memory after a multi-turn
                                        replay, per weight dtype
    python -m bench grammar             the structured-output grammar's cost per decode
                                        step at batch 1 and 16, as a share of the step
    python -m bench sampling            the sampler's cost per decode step with every
                                        setting on (penalties, logit_bias, top-k/p, min-p)
    python -m bench toolloop            an agent's tool loop with re-serialised arguments:
                                        the cached share of each turn
    python -m bench long-chat           conversations longer than the context: ours
                                        cutting whole turns, a client trimming each
                                        prompt, llama.cpp's --context-shift
    python -m bench agreement           greedy tokens equal to llama.cpp's on the same GGUF
    python -m bench kv-dtype            single-stream decode over long contexts with fp32
                                        and with bf16 K/V
    python -m bench load                thirty chat pages at once for --rounds (10):
                                        every reply's one message.done; hangs counted
    python -m bench model-sizes         random-weight GGUFs of 1B, 3B and 8B shapes: start
                                        time, memory, decode (bandwidth roofline) and a
                                        cold prompt, ours against llama.cpp on each file

Each subcommand takes --help.

A command is the module SUBCOMMANDS names, and imports no other command: what several
share lives in the shared modules. cli.py builds every parser and holds the common
options, sizes.py the usual chat shape, conversations.py and workloads.py the
workloads, engine_runs.py and hf_runs.py our engine and transformers in process,
chat_runs.py in-process chats, http_client.py the OpenAI-compatible client,
servers.py the servers started, metrics.py the figures, report.py what is printed and
written, ttft_plot.py the TTFT-by-turn PNG.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "engine": "bench.engine",
    "serve": "bench.serve",
    "multiturn": "bench.multiturn",
    "offload": "bench.offload",
    "plot": "bench.plot",
    "kernels-cpu": "bench.kernels_cpu",
    "prefill-cpu": "bench.prefill_cpu",
    "prefill-batch": "bench.prefill_batch",
    "shared-prefix": "bench.shared_prefix",
    "kernels-cuda": "bench.kernels_cuda",
    "llamacpp": "bench.llamacpp",
    "quant": "bench.quant",
    "quant-quality": "bench.quant_quality",
    "memory": "bench.memory",
    "grammar": "bench.grammar",
    "sampling": "bench.sampling",
    "toolloop": "bench.toolloop",
    "long-chat": "bench.long_chat",
    "agreement": "bench.agreement",
    "kv-dtype": "bench.kv_dtype",
    "model-sizes": "bench.model_sizes",
    "load": "bench.load",
}


def main(argv: list[str] | None = None):
    """Run a subcommand (the engine benchmark when none is named); returns its result."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = argv.pop(0) if argv and argv[0] in SUBCOMMANDS else "engine"
    return importlib.import_module(SUBCOMMANDS[name]).main(argv)
