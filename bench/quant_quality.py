"""How far quantized weights move the model from bf16, measured four ways.

    python -m bench quant-quality [--model M] [--new-tokens 32] [--weight-dtypes fp32,int8,int4]
        [--reference bf16|torch-fp32] [--out F]

For fp32 compute (the reference's own rounding noise), int8 and int4 against the
bf16 engine on the same weights (or, with --reference torch-fp32, against torch's own
fp32 forward on fp32 weights, no C kernel: how far this host's kernel path, with
each weight dtype, moves from it; kinds then run in the path's own dtype, and `bf16`
is bf16 storage):
- free: greedy replies to 8 chat prompts, the share of positions equal to bf16's
  (replies part at the first near-tie and differ wholesale after it);
- forced: fed bf16's greedy replies, the share of next tokens it also picks;
- log-prob: relative change of a held text's mean log-prob;
- KL: mean KL divergence of the held text's next-token distributions from bf16's,
  in nats a token.
"""

from __future__ import annotations

import contextlib

import torch

from bench import cli
from bench.engine_runs import greedy
from bench.report import progress_log, write_json
from inference import EngineConfig, LLMEngine, SamplingParams
from inference.sequence import Sequence
from kernels import cpu_kernels, f32_kernels
from kernels.cpu_features import cpu_path

log = progress_log("bench quant-quality")

PROMPTS = [
    "Write a story about a cat who finds a lost key.",
    "How does a refrigerator keep food cold?",
    "Give me advice for a first job interview.",
    "Explain what a prime number is, with examples.",
    "Describe a walk through a forest in autumn.",
    "What are the rules of chess for the knight?",
    "Write a letter to a friend about a trip to the sea.",
    "Explain how rain forms in clouds.",
]

HELD_TEXT = """\
The old bridge crossed the river at its narrowest point, where the banks were high
and rocky. It had been built of grey stone two hundred years before, and carts had
worn two smooth grooves into its surface. Every spring the engineers from the town
came to look at it, tapped the arches with small hammers, wrote in their notebooks
and went away again, and every spring the bridge stood as it always had.

On the far side there was a mill that no longer ground flour. A family of painters
had bought it and filled its rooms with canvases, and in summer they opened the doors
so that walkers could come in and look. Children liked the great wheel best, which
still turned slowly in the current although it was joined to nothing at all.
"""


def engine_for(model: str, kind: str, kv_dtype: str = "auto") -> LLMEngine:
    """The engine in the path's dtype with the given weights (and KV cache dtype), or
    the fp32 one."""
    if kind == "fp32":
        return LLMEngine(EngineConfig(model=model, dtype="float32", weight_dtype="fp32",
                                      num_blocks=512, kv_dtype=kv_dtype))
    return LLMEngine(EngineConfig(model=model, weight_dtype=kind, num_blocks=512,
                                  kv_dtype=kv_dtype))


@contextlib.contextmanager
def torch_only():
    """No C kernel runs inside: torch's own fp32 ops (the reference the kernels are held to)."""
    with contextlib.ExitStack() as stack:
        for module in (f32_kernels, cpu_kernels):
            stack.enter_context(_patched(module, "available", lambda: False))
        stack.enter_context(_patched(cpu_kernels, "quant_available", lambda: False))
        yield


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def reference_engine(model: str, reference: str) -> LLMEngine:
    """bf16's engine, or torch's fp32 forward on fp32 weights (no decode step in C)."""
    if reference == "bf16":
        return engine_for(model, "bf16")
    engine = LLMEngine(EngineConfig(model=model, dtype="float32", weight_dtype="fp32",
                                    num_blocks=512))
    engine.runner.model.decode_stack = None
    return engine


def replies(engine: LLMEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    return [o[0].token_ids for o in engine.generate(prompts, greedy(n))]


def logits(engine: LLMEngine, ids: list[int], chunks: list[int] | None = None) -> torch.Tensor:
    """fp32 logits of the positions of ids, nothing cached, computed in the given
    chunks (default: one, every position of a prefill; 1s are decode steps)."""
    engine.reset_prefix_cache()
    seq = Sequence("quality", 0, ids, SamplingParams())
    engine.kv.admit(seq, engine.kv.find_cached_blocks(seq), 0)
    rows = []
    try:
        for n in chunks or [len(ids)]:
            engine.kv.grow(seq, n)
            rows.append(engine.runner.full_logits([seq], [n]).float())
            seq.num_computed_tokens += n
    finally:
        engine.kv.free(seq)
    return torch.cat(rows)


def forced_choices(engine: LLMEngine, prompt: list[int], reply: list[int]) -> list[int]:
    """The engine's greedy choice at each position of `reply` given the prompt and the
    reply's earlier tokens: the prompt as one chunk, then one-row decode steps."""
    rows = logits(engine, prompt + reply, [len(prompt)] + [1] * (len(reply) - 1))
    return rows[len(prompt) - 1 :].argmax(-1).tolist()


def log_probs(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """fp64 log-probabilities of every next-token distribution along ids."""
    return torch.log_softmax(logits(engine, ids).double(), dim=-1)


def mean_log_prob(lp: torch.Tensor, ids: list[int]) -> float:
    """The mean log-prob that distributions lp (from log_probs) give ids' next tokens."""
    return lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).mean().item()


def kl_divergence(ref: torch.Tensor, lp: torch.Tensor) -> float:
    """Mean KL divergence of distributions lp from ref (log_probs), in nats a token."""
    return (ref.exp() * (ref - lp)).sum(-1).mean().item()


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """The share of positions where replies a and b hold the same token."""
    same = sum(x == y for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
    return same / sum(map(len, a))


def main(argv: list[str] | None = None) -> dict:
    parser = cli.parser("quant-quality", __doc__)
    cli.add(parser, "model")
    cli.add(parser, "new_tokens", 32)
    cli.add(parser, "weight_dtypes", "fp32,int8,int4", aliases=("--kinds",))
    parser.add_argument("--reference", choices=("bf16", "torch-fp32"), default="bf16",
                        help="what the weight dtypes are set against (default: %(default)s)")
    parser.add_argument("--kv-dtype", default="auto",
                        help="the KV cache dtype of the engines measured (EngineConfig.kv_dtype;"
                             " default: %(default)s)")
    cli.add(parser, "out", cli.RESULTS / "quant_quality.json")
    args = parser.parse_args(argv)

    base = reference_engine(args.model, args.reference)
    tok = base.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}],
                                       add_generation_prompt=True, return_dict=False)
               for p in PROMPTS]
    held = tok.encode(HELD_TEXT)
    with torch_only() if args.reference == "torch-fp32" else contextlib.nullcontext():
        ref_replies = replies(base, prompts, args.new_tokens)
        ref_lp = log_probs(base, held)
    ref_mean = mean_log_prob(ref_lp, held)
    del base

    results = {}
    for kind in args.weight_dtypes.split(","):
        log(f"{kind} against {args.reference}")
        engine = engine_for(args.model, kind, args.kv_dtype)
        ours = replies(engine, prompts, args.new_tokens)
        lp = log_probs(engine, held)
        results[kind] = {
            "free": agreement(ref_replies, ours),
            "first_difference": [next((i for i, (a, b) in enumerate(zip(r, o, strict=True))
                                       if a != b), len(r))
                                 for r, o in zip(ref_replies, ours, strict=True)],
            "forced": agreement(ref_replies, [forced_choices(engine, p, r)
                                              for p, r in zip(prompts, ref_replies, strict=True)]),
            "log_prob_change": abs(mean_log_prob(lp, held) - ref_mean) / abs(ref_mean),
            "kl": kl_divergence(ref_lp, lp),
            "dtype": engine.config.dtype,
            "kv_dtype": engine.config.kv_dtype,
            "cpu_path": engine.cpu_path,
        }
        del engine

    print(f"{'against ' + args.reference:14s} {'KV':>9s} {'free':>7s} {'forced':>7s} "
          f"{'log-prob':>9s} {'KL':>8s}")
    for kind, r in results.items():
        print(f"{kind:14s} {r['kv_dtype']:>9s} {r['free']:7.1%} {r['forced']:7.1%} "
              f"{r['log_prob_change']:9.2%} {r['kl']:8.4f}")
    data = {"kind": "quant-quality", "model": args.model, "new_tokens": args.new_tokens,
            "reference": args.reference, "cpu_path": cpu_path(),
            "prompts": len(PROMPTS), "held_tokens": len(held), "results": results}
    write_json(args.out, data, log)
    return data


if __name__ == "__main__":
    main()
