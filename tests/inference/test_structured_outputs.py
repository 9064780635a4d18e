"""Structured outputs in the engine: grammar masks per request beside continuous batching."""

import asyncio
import json

import jsonschema
import pytest
import torch

from inference import AsyncEngine, InvalidRequestError, SamplingParams
from inference.grammar import grammar_for_schema, mask_logits
from tests.inference.test_prefix_cache import rand_ids

# Finite: enums, bounded integers and strings, so even a random model must complete it.
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "name": {"type": "string", "maxLength": 10},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["colour", "count", "ok", "name", "tags"],
    "additionalProperties": False,
}
SCHEMA_TEXT = json.dumps(SCHEMA)


def constrained(**kw) -> SamplingParams:
    kw.setdefault("max_tokens", 80)
    return SamplingParams(json_schema=SCHEMA_TEXT, **kw)


def run(engine) -> dict:
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[(out.request_id, out.index)] = out
    return outs


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_output_validates_against_the_schema_and_ends_at_its_end(make_engine, temperature):
    engine = make_engine()
    for i in range(4):
        engine.add_request(f"r{i}", rand_ids(20 + i, i), constrained(temperature=temperature,
                                                                    seed=i))
    outs = run(engine)
    assert len(outs) == 4
    for out in outs.values():
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
        # Complete grammar: the end token closes the reply, as a model-written one does.
        assert out.token_ids[-1] in engine.eos_token_ids


def test_json_object_outputs_parse_as_objects(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=3, n=8,
                            json_schema=json.dumps({"type": "object"}))
    engine.add_request("obj", rand_ids(16, 5), params)
    outs = run(engine)
    stopped = [o for o in outs.values() if o.finish_reason == "stop"]
    assert stopped, [o.text for o in outs.values()]
    for out in stopped:
        assert isinstance(json.loads(out.text), dict)
    # Cut short or not, every reply is a JSON object's opening.
    assert all(o.text.startswith("{") for o in outs.values())


def test_unconstrained_requests_in_the_same_batch_are_unaffected(make_engine):
    plain = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = make_engine()
    alone.add_request("p", rand_ids(24, 9), plain)
    expected = run(alone)[("p", 0)].token_ids

    engine = make_engine()
    engine.add_request("c0", rand_ids(20, 1), constrained(temperature=0))
    engine.add_request("p", rand_ids(24, 9), plain)
    engine.add_request("c1", rand_ids(22, 2), constrained(temperature=1.0, seed=7))
    outs = run(engine)
    assert outs[("p", 0)].token_ids == expected
    for rid in ("c0", "c1"):
        jsonschema.validate(json.loads(outs[(rid, 0)].text), SCHEMA)


def test_mask_leaves_unconstrained_rows_bit_for_bit():
    class Seq:
        def __init__(self, grammar):
            self.grammar = grammar

    from inference.grammar import GrammarCompiler
    from inference.loader import load_tokenizer

    tokenizer = load_tokenizer()
    grammar = GrammarCompiler(tokenizer, 49152).compile(SCHEMA_TEXT)
    seqs = [Seq(None), Seq(grammar.matcher()), Seq(None)]
    logits = torch.randn(3, 49152)
    before = logits.clone()
    masked = mask_logits(logits, seqs, keep=True)
    assert torch.equal(logits, before)  # keep: the model's own logits stay for logprobs
    assert torch.equal(masked[0], before[0]) and torch.equal(masked[2], before[2])
    allowed = torch.isfinite(masked[1]).nonzero().flatten().tolist()
    # The one way this object can start, with its first key required: '{"' (one token).
    assert [tokenizer.decode([t]) for t in allowed] == ['{"']
    assert mask_logits(logits, [Seq(None)] * 3, keep=False) is logits


def test_preemption_recompute_does_not_advance_the_matcher_twice(make_engine):
    # A pool too small for all four: some are preempted and recomputed mid-reply.
    engine = make_engine(num_blocks=10, max_num_seqs=4, enable_prefix_caching=False)
    seqs = []
    for i in range(4):
        engine.add_request(f"r{i}", rand_ids(30, 20 + i), constrained(temperature=0))
        seqs += engine.requests[f"r{i}"]
    outs = run(engine)
    assert engine.scheduler.num_preemptions > 0
    for seq in seqs:
        assert seq.grammar.num_accepted == seq.num_output_tokens
    for out in outs.values():
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_logprobs_see_the_model_s_distribution_not_the_mask(make_engine):
    engine = make_engine()
    engine.add_request("lp", rand_ids(20, 4), constrained(temperature=0, logprobs=2))
    entries, text = [], ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            entries += out.new_logprobs or []
            text = out.text
    jsonschema.validate(json.loads(text), SCHEMA)
    assert entries and all(e.logprob <= e.top[0][1] for e in entries)
    # The first token is forced ('{"'); the unmasked model preferred another one.
    first = entries[0]
    assert engine.tokenizer.decode([first.token_id]) == '{"' and first.top[0][0] != first.token_id


@pytest.mark.parametrize("schema,needle", [
    ({"type": "foo"}, "foo"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "properties": {}, "required": ["x"], "additionalProperties": False},
     "x"),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ([1, 2], "object"),
])
def test_a_schema_we_cannot_honour_is_refused_by_name(make_engine, schema, needle):
    with pytest.raises(InvalidRequestError) as err:
        grammar_for_schema(json.dumps(schema))
    assert err.value.param == "response_format" and needle in str(err.value)
    engine = make_engine()
    with pytest.raises(InvalidRequestError):
        engine.add_request("bad", rand_ids(8, 1), SamplingParams(json_schema=json.dumps(schema)))
    assert not engine.has_unfinished_requests()


def test_a_schema_that_fails_at_its_first_mask_is_refused_at_compile(make_engine):
    # Valid as a document, but no value can be generated: refused, not a failed reply.
    engine = make_engine()
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("r", rand_ids(8, 1), SamplingParams(json_schema='{"$ref": "#"}'))
    assert err.value.param == "response_format" and "no JSON value" in str(err.value)


def test_async_engine_compiles_before_queueing_and_refuses_bad_schemas(make_engine):
    async def main():
        engine = AsyncEngine(engine=make_engine())
        try:
            bad = engine.generate(rand_ids(8, 1), SamplingParams(json_schema='{"type": 5}'))
            with pytest.raises(InvalidRequestError):
                await bad.__anext__()
            outs = [o async for o in engine.generate(rand_ids(12, 2), constrained(temperature=0))]
            return outs[-1]
        finally:
            engine.shutdown()

    last = asyncio.run(main())
    assert last.finish_reason == "stop"
    jsonschema.validate(json.loads(last.text), SCHEMA)


def test_compiled_grammars_are_cached_per_schema(make_engine):
    engine = make_engine()
    a, b = SamplingParams(json_schema=SCHEMA_TEXT), SamplingParams(json_schema=SCHEMA_TEXT)
    engine.compile_grammar(a)
    engine.compile_grammar(b)
    assert a.grammar is b.grammar


def test_a_grammar_out_of_fuel_fails_its_request_only(make_engine, monkeypatch):
    # Limits so low the first string's pattern exhausts them: the matcher fails, its mask
    # leaves only the end token, and that end must not pass for a complete value.
    import inference.grammar as grammar

    monkeypatch.setattr(grammar, "LIMITS", {**grammar.LIMITS, "step_lexer_fuel": 50,
                                            "step_max_items": 5})
    schema = {"type": "object", "required": ["name"],
              "properties": {"name": {"type": "string", "pattern": "^[a-z]{3,40}(x|y){2,9}$"}}}
    engine = make_engine()
    engine.add_request("g", rand_ids(10, 1), SamplingParams(max_tokens=40,
                                                            json_schema=json.dumps(schema)))
    engine.add_request("p", rand_ids(10, 2), SamplingParams(max_tokens=5, ignore_eos=True))
    outs = run(engine)
    assert outs[("g", 0)].finish_reason == "error"
    assert "structured output" in outs[("g", 0)].error
    assert outs[("p", 0)].finish_reason == "length"
    # The caller's schema is at fault: the request's error says so (inference.grammar).
    assert grammar.failure_of(outs[("g", 0)].error)
    assert grammar.failure_of("generation failed: boom") is None


class _Panic(BaseException):
    """What pyo3 raises for a panic inside the grammar library."""


@pytest.mark.parametrize("where", ["grammar_from_json_schema", "validate_grammar_with_warnings"])
def test_the_grammar_library_raising_while_checking_is_a_refusal(monkeypatch, where):
    import llguidance as llg

    def raises(*args, **kw):
        raise _Panic("Too many items")

    monkeypatch.setattr(llg.LLMatcher, where, raises)
    with pytest.raises(InvalidRequestError) as err:
        grammar_for_schema(SCHEMA_TEXT, "tools[0].function.parameters")
    assert err.value.param == "tools[0].function.parameters" and "Too many" in str(err.value)


def test_the_grammar_library_raising_while_compiling_is_a_refusal(make_engine, monkeypatch):
    import inference.grammar as grammar

    class Matcher:
        def __init__(self, *args, **kw):
            raise _Panic("Too many items")

    engine = make_engine()
    monkeypatch.setattr(grammar.llg, "LLMatcher", type(
        "LLMatcher", (Matcher,), {k: getattr(grammar.llg.LLMatcher, k) for k in (
            "grammar_from_json_schema", "validate_grammar_with_warnings")}))
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("r", rand_ids(8, 1), SamplingParams(json_schema=SCHEMA_TEXT))
    assert err.value.param == "response_format" and "Too many" in str(err.value)
    assert not engine.has_unfinished_requests()
