"""How far quantized weights move the model from bf16, measured four ways.

    python -m bench quant-quality [--model M] [--new-tokens 32] [--out F]

For fp32 compute (the reference's own rounding noise), int8 and int4 against the
bf16 engine on the same weights:
- free: greedy replies to 8 chat prompts, the share of positions equal to bf16's
  (replies part at the first near-tie and differ wholesale after it);
- forced: fed bf16's greedy replies, the share of next tokens it also picks;
- log-prob: relative change of a held text's mean log-prob;
- KL: mean KL divergence of the held text's next-token distributions from bf16's,
  in nats a token.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.report import progress_log
from inference import EngineConfig, LLMEngine, SamplingParams
from inference.config import DEFAULT_MODEL
from inference.sequence import Sequence

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


def engine_for(model: str, kind: str) -> LLMEngine:
    """The bf16 engine with the given weights, or the fp32 one."""
    if kind == "fp32":
        return LLMEngine(EngineConfig(model=model, dtype="float32", num_blocks=512))
    return LLMEngine(EngineConfig(model=model, weight_dtype=kind, num_blocks=512))


def greedy(engine: LLMEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o[0].token_ids for o in engine.generate(prompts, params)]


def logits(engine: LLMEngine, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """fp32 logits of the last position of each chunk of ids, nothing cached: one
    chunk gives every position of a prefill, 1s give decode steps."""
    engine.reset_prefix_cache()
    seq = Sequence(10**6, "quality", 0, ids, SamplingParams())
    engine.kv.admit(seq, engine.kv.find_cached_blocks(seq), 0)
    rows = []
    try:
        for n in chunks:
            engine.kv.grow(seq, n)
            rows.append(engine.runner.full_logits([seq], [n]).float())
            seq.num_computed_tokens += n
    finally:
        engine.kv.free(seq)
    return torch.cat(rows)


def forced_agreement(engine: LLMEngine, prompts, replies) -> float:
    same = total = 0
    for prompt, reply in zip(prompts, replies, strict=True):
        rows = logits(engine, prompt + reply, [len(prompt)] + [1] * (len(reply) - 1))
        picks = rows[len(prompt) - 1 :].argmax(-1).tolist()
        same += sum(a == b for a, b in zip(picks, reply, strict=True))
        total += len(reply)
    return same / total


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench quant-quality",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--kinds", default="fp32,int8,int4")
    parser.add_argument("--out", type=Path, default=Path("bench-results/quant_quality.json"))
    args = parser.parse_args(argv)

    base = engine_for(args.model, "bf16")
    tok = base.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}],
                                       add_generation_prompt=True, return_dict=False)
               for p in PROMPTS]
    held = tok.encode(HELD_TEXT)
    ref_replies = greedy(base, prompts, args.new_tokens)
    ref_lp = torch.log_softmax(logits(base, held, [len(held)]).double(), -1)
    targets = torch.tensor(held[1:])[:, None]
    ref_mean = ref_lp[:-1].gather(1, targets).mean().item()

    results = {}
    for kind in args.kinds.split(","):
        log(f"{kind} against bf16")
        engine = engine_for(args.model, kind)
        replies = greedy(engine, prompts, args.new_tokens)
        lp = torch.log_softmax(logits(engine, held, [len(held)]).double(), -1)
        results[kind] = {
            "free": sum(a == b for r, o in zip(ref_replies, replies, strict=True)
                        for a, b in zip(r, o, strict=True)) / sum(map(len, ref_replies)),
            "first_difference": [next((i for i, (a, b) in enumerate(zip(r, o, strict=True))
                                       if a != b), len(r))
                                 for r, o in zip(ref_replies, replies, strict=True)],
            "forced": forced_agreement(engine, prompts, ref_replies),
            "log_prob_change": abs(lp[:-1].gather(1, targets).mean().item() - ref_mean)
            / abs(ref_mean),
            "kl": (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean().item(),
        }
        del engine

    print(f"{'against bf16':14s} {'free':>7s} {'forced':>7s} {'log-prob':>9s} {'KL':>8s}")
    for kind, r in results.items():
        print(f"{kind:14s} {r['free']:7.1%} {r['forced']:7.1%} {r['log_prob_change']:9.2%} "
              f"{r['kl']:8.4f}")
    data = {"kind": "quant-quality", "model": args.model, "new_tokens": args.new_tokens,
            "prompts": len(PROMPTS), "held_tokens": len(held), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2))
    log(f"wrote {args.out}")
    return data


if __name__ == "__main__":
    main()
