"""The structured-output grammar's cost per decode step, as a share of the step:

    python -m bench grammar [--batches 1 16] [--new-tokens 48] [--rounds 3]
                            [--out bench-results/grammar.json]

Each round runs, at each batch size, the same chat prompts twice on the default model:
constrained by a JSON Schema (response_format's path: inference.grammar) and free. Both
decode exactly --new-tokens tokens a sequence (the schema's array has a minItems the
replies cannot reach first, so no sequence leaves the batch early). Per decode step (the
steps after every prompt's prefill) it times the whole engine step and, inside it, the
grammar's own work: filling the constrained rows' bitmasks, applying them to the logits
and advancing each matcher by its token. Reported: the grammar's share of the constrained
step, and the constrained step against the free one (medians over
rounds; the two runs take turns, so host noise lands on both).
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from bench import cli
from bench.engine_runs import engine_config
from bench.report import write_json
from inference import LLMEngine, SamplingParams, llm_engine
from inference import grammar as grammar_mod

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "rating": {"enum": [1, 2, 3, 4, 5]},
        "year": {"type": "integer"},
        "recommended": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 200},
    },
    "required": ["title", "rating", "year", "recommended", "tags"],
    "additionalProperties": False,
}
TOPICS = ["a lighthouse", "a mountain village", "a jazz record", "a chess opening",
          "a desert road", "a rainy harbour", "a violin maker", "a night train",
          "an old library", "a coral reef", "a space probe", "a bakery at dawn",
          "a glacier", "a street market", "a windmill", "a paper kite"]


class GrammarClock:
    """Seconds spent in the grammar's work (mask fill + apply, matcher advance)."""

    def __init__(self):
        self.seconds = 0.0
        self._mask = llm_engine.mask_logits
        self._accept = grammar_mod.Matcher.accept

    def __enter__(self) -> GrammarClock:
        clock, mask, accept = self, self._mask, self._accept

        def timed_mask(*args, **kw):
            start = time.perf_counter()
            try:
                return mask(*args, **kw)
            finally:
                clock.seconds += time.perf_counter() - start

        def timed_accept(matcher, token):
            start = time.perf_counter()
            try:
                return accept(matcher, token)
            finally:
                clock.seconds += time.perf_counter() - start

        llm_engine.mask_logits = timed_mask
        grammar_mod.Matcher.accept = timed_accept
        return self

    def __exit__(self, *exc) -> None:
        llm_engine.mask_logits = self._mask
        grammar_mod.Matcher.accept = self._accept


def prompts(tokenizer, batch: int, round_: int) -> list[list[int]]:
    # A round's own prompts: no run hits the prefix cache an earlier one filled.
    return [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Review {TOPICS[i % len(TOPICS)]} (take {round_}, "
                                     f"{i // len(TOPICS)}) as JSON."}],
        add_generation_prompt=True, return_dict=False) for i in range(batch)]


def decode_steps(engine: LLMEngine, ids: list[list[int]], params: SamplingParams) -> dict:
    """Run the batch; per decode step the step's seconds and the grammar's within it."""
    for i, prompt in enumerate(ids):
        engine.add_request(f"g{time.monotonic_ns()}-{i}", prompt, params)
    steps, grammar = [], []
    with GrammarClock() as clock:
        while engine.has_unfinished_requests():
            before = clock.seconds
            start = time.perf_counter()
            outs = engine.step()
            took = time.perf_counter() - start
            # A decode step: every sequence already had its first token.
            if outs and all(len(o.token_ids) > 1 for o in outs):
                steps.append(took)
                grammar.append(clock.seconds - before)
    if not steps:
        raise SystemExit("no decode steps: raise --new-tokens")
    return {"step_s": statistics.median(steps),
            "grammar_s": statistics.median(grammar),
            "share": sum(grammar) / sum(steps), "steps": len(steps)}


def main(argv: list[str] | None = None) -> dict:
    parser = cli.parser("grammar", __doc__)
    parser.add_argument("--batches", type=cli.positive_int, nargs="+", default=[1, 16],
                        help="batch sizes (default: 1 16)")
    cli.add(parser, "new_tokens", 48)
    cli.add(parser, "rounds", 3)
    cli.add(parser, "threads")
    cli.add(parser, "model")
    cli.add(parser, "out", cli.RESULTS / "grammar.json")
    args = parser.parse_args(argv)
    cli.set_threads(args.threads)

    engine = LLMEngine(engine_config(args.model, "auto", num_blocks=64 * max(args.batches),
                                     max_num_seqs=max(args.batches)))
    schema = json.dumps(SCHEMA)
    constrained = SamplingParams(max_tokens=args.new_tokens, temperature=0, json_schema=schema)
    free = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    engine.compile_grammar(constrained)  # the tokenizer index and the compile: not a step's
    runs: dict[int, dict[str, list[dict]]] = {b: {"json": [], "free": []} for b in args.batches}
    for r in range(args.rounds):
        for b in args.batches:
            ids = prompts(engine.tokenizer, b, r)
            order = [("json", constrained), ("free", free)]
            for name, params in order if r % 2 == 0 else order[::-1]:
                engine.reset_prefix_cache()
                runs[b][name].append(decode_steps(engine, ids, params))
            j, f = runs[b]["json"][-1], runs[b]["free"][-1]
            print(f"round {r + 1}/{args.rounds} batch {b}: step {j['step_s'] * 1e3:.2f} ms "
                  f"(free {f['step_s'] * 1e3:.2f} ms), grammar {j['grammar_s'] * 1e3:.3f} ms "
                  f"= {j['share']:.1%}", flush=True)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    result = {"model": engine.model_name, "dtype": engine.config.dtype,
              "weight_dtype": engine.config.weight_dtype, "cpu_path": engine.cpu_path,
              "threads": torch.get_num_threads(), "rounds": args.rounds,
              "new_tokens": args.new_tokens, "schema": SCHEMA, "batches": {}}
    print(f"\ngrammar mask per decode step ({result['threads']} threads, "
          f"{args.new_tokens} tokens, median of {args.rounds} rounds):")
    for b in args.batches:
        j, f = runs[b]["json"], runs[b]["free"]
        row = {"step_ms": med(j, "step_s") * 1e3, "free_step_ms": med(f, "step_s") * 1e3,
               "grammar_ms": med(j, "grammar_s") * 1e3, "grammar_share": med(j, "share"),
               "rounds": {"json": j, "free": f}}
        row["step_vs_free"] = row["step_ms"] / row["free_step_ms"] - 1
        result["batches"][b] = row
        print(f"  batch {b:2d}: grammar {row['grammar_ms']:.3f} ms of a {row['step_ms']:.2f} ms "
              f"step = {row['grammar_share']:.1%}; the free step {row['free_step_ms']:.2f} ms "
              f"({row['step_vs_free']:+.1%})")
    write_json(args.out, result)
    return result
