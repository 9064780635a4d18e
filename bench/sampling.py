"""The sampler's cost per decode step with every sampling setting on, as a share of the step:

    python -m bench sampling [--batches 1 16] [--new-tokens 48] [--rounds 3]
                             [--out bench-results/sampling.json]

Each round runs, at each batch size, the same chat prompts twice on the default model:
with every setting on (temperature, top_k, top_p, min_p, presence, frequency and
repetition penalties, a 16-token logit_bias, a seed per request) and with temperature
alone (the draw every random request pays). Both decode exactly --new-tokens tokens a
sequence. Per decode step it times the whole engine step and, inside it, the sampler's
work: penalties and logit_bias (inference.sampler.adjust_logits) and the draw with its
truncation (inference.sampler.sample). Reported: the sampler's share of the step with
everything on, and its time against the plain draw's (medians over rounds; the two runs
take turns, so host noise lands on both).
"""

from __future__ import annotations

import statistics
import time

import torch

from bench import cli
from bench.engine_runs import engine_config
from bench.report import write_json
from inference import LLMEngine, SamplingParams, llm_engine

TOPICS = ["a lighthouse", "a mountain village", "a jazz record", "a chess opening",
          "a desert road", "a rainy harbour", "a violin maker", "a night train",
          "an old library", "a coral reef", "a space probe", "a bakery at dawn",
          "a glacier", "a street market", "a windmill", "a paper kite"]
TIMED = ("adjust_logits", "sample")


def all_on(new_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.8, top_k=40,
                          top_p=0.9, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.5,
                          repetition_penalty=1.1, logit_bias={t: -5.0 for t in range(100, 116)},
                          seed=seed)


def plain(new_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.8)


class SamplerClock:
    """Seconds spent in the sampler's functions the engine step calls."""

    def __init__(self):
        self.seconds = 0.0
        self._real = {name: getattr(llm_engine, name) for name in TIMED}

    def __enter__(self) -> SamplerClock:
        for name, real in self._real.items():
            setattr(llm_engine, name, self._timed(real))
        return self

    def _timed(self, real):
        def timed(*args, **kw):
            start = time.perf_counter()
            try:
                return real(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - start
        return timed

    def __exit__(self, *exc) -> None:
        for name, real in self._real.items():
            setattr(llm_engine, name, real)


def prompts(tokenizer, batch: int, round_: int) -> list[list[int]]:
    # A round's own prompts: no run hits the prefix cache an earlier one filled.
    return [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]} (take "
                                     f"{round_}, {i // len(TOPICS)})."}],
        add_generation_prompt=True, return_dict=False) for i in range(batch)]


def decode_steps(engine: LLMEngine, ids: list[list[int]], params: list[SamplingParams]) -> dict:
    """Run the batch; per decode step the step's seconds and the sampler's within it."""
    for i, (prompt, p) in enumerate(zip(ids, params, strict=True)):
        engine.add_request(f"s{time.monotonic_ns()}-{i}", prompt, p)
    steps, sampler = [], []
    with SamplerClock() as clock:
        while engine.has_unfinished_requests():
            before = clock.seconds
            start = time.perf_counter()
            outs = engine.step()
            took = time.perf_counter() - start
            # A decode step: every sequence already had its first token.
            if outs and all(len(o.token_ids) > 1 for o in outs):
                steps.append(took)
                sampler.append(clock.seconds - before)
    if not steps:
        raise SystemExit("no decode steps: raise --new-tokens")
    # The minima too: on a shared host, what a step costs when nothing else runs.
    return {"step_s": statistics.median(steps), "sampler_s": statistics.median(sampler),
            "step_min_s": min(steps), "sampler_min_s": min(sampler),
            "share": sum(sampler) / sum(steps), "steps": len(steps)}


def main(argv: list[str] | None = None) -> dict:
    parser = cli.parser("sampling", __doc__)
    parser.add_argument("--batches", type=cli.positive_int, nargs="+", default=[1, 16],
                        help="batch sizes (default: 1 16)")
    cli.add(parser, "new_tokens", 48)
    cli.add(parser, "rounds", 3)
    cli.add(parser, "threads")
    cli.add(parser, "model")
    cli.add(parser, "out", cli.RESULTS / "sampling.json")
    args = parser.parse_args(argv)
    cli.set_threads(args.threads)

    engine = LLMEngine(engine_config(args.model, "auto", num_blocks=64 * max(args.batches),
                                     max_num_seqs=max(args.batches)))
    runs: dict[int, dict[str, list[dict]]] = {b: {"all": [], "plain": []} for b in args.batches}
    for r in range(args.rounds):
        for b in args.batches:
            ids = prompts(engine.tokenizer, b, r)
            order = [("all", [all_on(args.new_tokens, r * 1000 + i) for i in range(b)]),
                     ("plain", [plain(args.new_tokens)] * b)]
            for name, params in order if r % 2 == 0 else order[::-1]:
                engine.reset_prefix_cache()
                runs[b][name].append(decode_steps(engine, ids, params))
            a, p = runs[b]["all"][-1], runs[b]["plain"][-1]
            print(f"round {r + 1}/{args.rounds} batch {b}: step {a['step_s'] * 1e3:.2f} ms, "
                  f"sampler {a['sampler_s'] * 1e3:.3f} ms = {a['share']:.1%} "
                  f"(temperature alone: {p['sampler_s'] * 1e3:.3f} ms of "
                  f"{p['step_s'] * 1e3:.2f} ms)", flush=True)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    result = {"model": engine.model_name, "dtype": engine.config.dtype,
              "weight_dtype": engine.config.weight_dtype, "cpu_path": engine.cpu_path,
              "device": str(engine.runner.device), "threads": torch.get_num_threads(),
              "rounds": args.rounds, "new_tokens": args.new_tokens,
              "settings": repr(all_on(args.new_tokens, 0)), "batches": {}}
    print(f"\nsampler per decode step, every setting on ({result['threads']} threads, "
          f"{args.new_tokens} tokens, median of {args.rounds} rounds):")
    for b in args.batches:
        a, p = runs[b]["all"], runs[b]["plain"]
        row = {"step_ms": med(a, "step_s") * 1e3, "sampler_ms": med(a, "sampler_s") * 1e3,
               "sampler_share": med(a, "share"), "plain_step_ms": med(p, "step_s") * 1e3,
               "plain_sampler_ms": med(p, "sampler_s") * 1e3,
               "step_min_ms": min(r["step_min_s"] for r in a) * 1e3,
               "sampler_min_ms": min(r["sampler_min_s"] for r in a) * 1e3,
               "rounds": {"all": a, "plain": p}}
        result["batches"][b] = row
        print(f"  batch {b:2d}: sampler {row['sampler_ms']:.3f} ms of a {row['step_ms']:.2f} ms "
              f"step = {row['sampler_share']:.1%}; temperature alone "
              f"{row['plain_sampler_ms']:.3f} ms of {row['plain_step_ms']:.2f} ms; fastest: "
              f"sampler {row['sampler_min_ms']:.3f} ms, step {row['step_min_ms']:.2f} ms")
    write_json(args.out, result)
    return result
