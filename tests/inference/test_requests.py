"""Bad input, faults inside a step, sampling settings and text output."""

import asyncio

import pytest

from inference import AsyncEngine, InvalidRequestError, SamplingParams
from inference.detokenizer import detokenize_incrementally
from inference.sequence import Sequence
from tests.inference.conftest import decode_rows_round_to_int16
from tests.inference.test_prefix_cache import rand_ids


@pytest.mark.parametrize(
    "prompt,params,param",
    [
        ([], SamplingParams(), "prompt"),
        (list(range(3, 5000)), SamplingParams(), "messages"),
        ([5, 6], SamplingParams(temperature=-0.1), "temperature"),
        ([5, 6], SamplingParams(top_p=0), "top_p"),
        ([5, 6], SamplingParams(top_p=1.5), "top_p"),
        ([5, 6], SamplingParams(max_tokens=0), "max_tokens"),
        ([5, 6], SamplingParams(n=0), "n"),
        ([5, 10**9], SamplingParams(), "prompt"),
    ],
)
def test_bad_requests_are_refused_and_the_engine_goes_on(make_engine, prompt, params, param):
    engine = make_engine(num_blocks=512, max_model_len=4096)
    engine.add_request("good", rand_ids(20, 1), SamplingParams(max_tokens=4, ignore_eos=True))
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("bad", prompt, params)
    assert err.value.param == param
    assert str(err.value)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].request_id == "good" and outs[-1].finish_reason == "length"


def test_prompt_over_context_names_the_code(make_engine):
    engine = make_engine(max_model_len=64)
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("x", rand_ids(64, 2), SamplingParams())
    assert err.value.code == "context_length_exceeded"
    assert "64" in str(err.value)


def test_fault_in_a_step_fails_that_step_only(make_engine, monkeypatch):
    engine = make_engine()
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.add_request("a", rand_ids(30, 3), params)
    engine.step()
    real = engine.runner.execute
    calls = {"n": 0}

    def faulty(seqs, num_tokens, scoring=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real(seqs, num_tokens, scoring)

    monkeypatch.setattr(engine.runner, "execute", faulty)
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("a", "error")]
    assert "injected fault" in outs[0].error
    assert engine.metrics_snapshot()["blocks_used"] == 0
    # The engine still serves new requests.
    [[ok]] = engine.generate([rand_ids(30, 4)], params)
    assert ok.finish_reason == "length" and len(ok.token_ids) == 6


def test_same_seed_same_tokens_other_seed_differs(make_engine):
    engine = make_engine()
    prompt = rand_ids(40, 5)

    def run(seed):
        p = SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True)
        return engine.generate([prompt], p)[0][0].token_ids

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_top_k_one_is_greedy_and_top_p_keeps_the_nucleus(make_engine):
    engine = make_engine()
    prompt = rand_ids(40, 6)
    greedy = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0,
                                                      ignore_eos=True))[0][0].token_ids
    top1 = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=1.5, top_k=1,
                                                    seed=3, ignore_eos=True))[0][0].token_ids
    tiny_p = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0,
                                                      top_p=1e-6, seed=4,
                                                      ignore_eos=True))[0][0].token_ids
    assert top1 == greedy == tiny_p


def test_n_samples_with_a_seed_are_reproducible(make_engine):
    engine = make_engine()
    params = SamplingParams(n=3, max_tokens=10, temperature=1.0, seed=11, ignore_eos=True)
    first = [o.token_ids for o in engine.generate([rand_ids(50, 7)], params)[0]]
    second = [o.token_ids for o in engine.generate([rand_ids(50, 7)], params)[0]]
    assert first == second and len(first) == 3 and len({tuple(t) for t in first}) > 1


def test_stop_token_ids_and_max_tokens(make_engine):
    engine = make_engine()
    prompt = rand_ids(30, 8)
    free = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0,
                                                    ignore_eos=True))[0][0]
    stop_at = free.token_ids[3]
    stopped = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0,
                                                       stop_token_ids=[stop_at]))[0][0]
    first = free.token_ids.index(stop_at)
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"
    assert free.finish_reason == "length" and len(free.token_ids) == 10


def test_stop_strings_cut_the_text_and_are_never_streamed(make_engine):
    engine = make_engine()
    prompt = rand_ids(30, 9)
    free = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0,
                                                    ignore_eos=True))[0][0]
    text = free.text
    assert len(text) > 8
    stop = text[5:8]
    engine.add_request("s", prompt, SamplingParams(max_tokens=16, temperature=0, stop=[stop],
                                                   ignore_eos=True))
    streamed = ""
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed += out.text_delta
            last = out
    assert last.finish_reason == "stop"
    assert streamed == last.text == text[: text.find(stop)]


def test_incremental_detokenization_never_splits_a_character(smollm2_tokenizer):
    tok = smollm2_tokenizer
    text = "Grüße 👋🏽 日本語 ok"
    ids = tok.encode(text, add_special_tokens=False)
    seq = Sequence("d", 0, [1], SamplingParams())
    pieces = []
    for t in ids:
        before = seq.text
        seq.append_token(t)
        detokenize_incrementally(tok, seq)
        pieces.append(seq.text[len(before):])
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(ids) > len(text.split())  # some characters really span several tokens


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from inference.loader import load_tokenizer

    return load_tokenizer()


def test_async_engine_streams_aborts_and_refuses_bad_input(make_engine):
    engine = AsyncEngine(engine=make_engine())

    async def scenario():
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        outs = [o async for o in engine.generate(rand_ids(30, 10), params)]
        assert outs[-1].finished and len(outs[-1].token_ids) == 12
        assert sum(len(o.new_token_ids) for o in outs) == 12
        assert outs[0].ttft is not None and outs[0].prompt_tokens == 30

        # Leaving the loop early aborts the request and frees its blocks.
        long = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
        async for _ in engine.generate(rand_ids(30, 11), long, request_id="leave"):
            break
        # Concurrent requests each get their own stream.
        async def one(i):
            return [o async for o in engine.generate(rand_ids(20, 20 + i), params)]
        results = await asyncio.gather(*(one(i) for i in range(5)))
        assert all(r[-1].finish_reason == "length" for r in results)

        with pytest.raises(InvalidRequestError):
            async for _ in engine.generate([], params):
                pass
        # Explicit abort from elsewhere ends the stream with finish_reason "abort".
        async def consume():
            return [o async for o in engine.generate(rand_ids(25, 12), long, request_id="stopme")]
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        engine.abort("stopme")
        outs = await asyncio.wait_for(task, 30)
        assert outs[-1].finish_reason == "abort"
        for _ in range(100):
            if engine.metrics()["blocks_used"] == 0:
                break
            await asyncio.sleep(0.05)
        assert engine.metrics()["blocks_used"] == 0

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()


def test_bf16_engine_packs_its_weights_and_decodes_as_the_plain_one(make_engine):
    """Packing the matmul weights for oneDNN (where this path packs bf16) changes the
    speed, not the tokens."""
    from kernels.cpu_linear import can_pack

    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[5, 17, 300, 42], [9, 9, 81, 4000, 12, 7], [77]]
    outputs = {}
    for pack in (True, False):
        engine = make_engine(dtype="bfloat16", pack_weights=pack, weight_dtype="bf16")
        down = engine.runner.model.layers[0].mlp.down_proj
        assert (down.packed is not None) == (pack and can_pack(down.weight))
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.token_ids
        outputs[pack] = [done[f"r{i}"] for i in range(len(prompts))]
    assert outputs[True] == outputs[False]


def test_greedy_takes_the_first_maximum_in_the_logits_own_dtype():
    """bf16 logits tie often; greedy picks the lowest id among the maxima, as argmax
    over the same logits cast to fp32 does (transformers' choice)."""
    import torch

    from inference.sampler import sample

    logits = torch.randn(3, 50).bfloat16()
    logits[0, [7, 31]] = 9.0
    logits[1, 49] = 9.0
    logits[2, [0, 1]] = 9.0
    seqs = [Sequence(f"r{i}", 0, [1], SamplingParams(temperature=0.0)) for i in range(3)]
    assert sample(logits, seqs) == [7, 49, 0]
    assert sample(logits, seqs) == logits.float().argmax(-1).tolist()


def test_async_engine_checks_requests_on_its_step_thread_only(make_engine, monkeypatch):
    """The caller's thread only enqueues: encoding and every check run where the engine's
    state lives, and a refusal still reaches the caller as InvalidRequestError."""
    import threading

    llm = make_engine()
    checked_on: list[str] = []
    validate = llm.validate

    def spy(*args, **kwargs):
        checked_on.append(threading.current_thread().name)
        return validate(*args, **kwargs)

    monkeypatch.setattr(llm, "validate", spy)
    engine = AsyncEngine(engine=llm)

    async def scenario():
        too_long = rand_ids(llm.max_model_len + 1, 3)
        with pytest.raises(InvalidRequestError) as refused:
            async for _ in engine.generate(too_long, SamplingParams(max_tokens=1)):
                pass
        assert refused.value.code == "context_length_exceeded"
        outs = [o async for o in engine.generate("Hello", SamplingParams(max_tokens=2))]
        assert outs[-1].finished

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert checked_on and set(checked_on) == {"engine-step"}


def test_a_running_request_id_is_refused_by_either_engine_in_one_wording(make_engine):
    llm = make_engine()
    params = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    llm.add_request("twice", rand_ids(20, 4), params)
    with pytest.raises(InvalidRequestError) as sync_refusal:
        llm.add_request("twice", rand_ids(20, 5), params)
    llm.abort("twice")
    run_all(llm)
    engine = AsyncEngine(engine=llm)

    async def scenario():
        first = engine.generate(rand_ids(20, 6), params, request_id="twice")
        await anext(first)
        with pytest.raises(InvalidRequestError) as async_refusal:
            await anext(engine.generate(rand_ids(20, 7), params, request_id="twice"))
        await first.aclose()
        return async_refusal.value

    try:
        async_refusal = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert str(async_refusal) == str(sync_refusal.value) == "request id 'twice' is already running"
    assert async_refusal.param == sync_refusal.value.param == "request_id"


def test_a_fault_while_adding_a_request_ends_each_sample_with_an_error(make_engine, monkeypatch):
    llm = make_engine()

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(llm, "add_request", broken)
    engine = AsyncEngine(engine=llm)

    async def scenario():
        params = SamplingParams(max_tokens=2, n=2)
        return [o async for o in engine.generate(rand_ids(20, 8), params, request_id="f")]

    try:
        outs = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert sorted(o.index for o in outs) == [0, 1]
    for out in outs:
        assert (out.finished, out.finish_reason, out.error) == (True, "error", "injected fault")
        assert out.prompt_tokens == 0 and out.token_ids == []


def run_all(engine) -> list:
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    return outs


def test_logprobs_are_the_model_s_log_softmax_at_each_generated_position(make_engine):
    """Each generated token's logprob (and its top alternatives) is the log-softmax of the
    logits at its position: checked against a fresh forward over prompt + output."""
    engine = make_engine()
    prompt = list(range(100, 140))
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=3, logprobs=4)
    engine.add_request("lp", prompt, params)
    outs = run_all(engine)
    ids = [t for o in outs for t in o.new_token_ids]
    entries = [e for o in outs for e in o.new_logprobs]
    assert [e.token_id for e in entries] == ids and len(ids) == 6

    check = make_engine(enable_prefix_caching=False)
    # The reference forward is a prefill; the logprobs came from decode rows, which on
    # quantized weights may round their activations to int16 (kernels.f32_kernels).
    tol = 2e-3 if decode_rows_round_to_int16(engine) else 1e-4
    for i, entry in enumerate(entries):
        context = prompt + ids[:i]
        check.add_request(f"ref{i}", context, SamplingParams(max_tokens=1, logprobs=20))
        ref = next(e for o in run_all(check) for e in (o.new_logprobs or []))
        reference = dict(ref.top)
        assert len(entry.top) == 4 and entry.top[0][1] >= entry.top[-1][1]
        for token, logprob in entry.top:
            assert abs(reference[token] - logprob) < tol
        if entry.token_id in reference:
            assert abs(reference[entry.token_id] - entry.logprob) < tol
        assert entry.logprob <= 0 and entry.logprob <= entry.top[0][1] + 1e-6


def test_without_logprobs_none_are_computed(make_engine):
    engine = make_engine()
    engine.add_request("plain", list(range(100, 120)), SamplingParams(max_tokens=3))
    assert all(o.new_logprobs is None for o in run_all(engine))
    with pytest.raises(InvalidRequestError):
        engine.add_request("bad", [1, 2, 3], SamplingParams(logprobs=21))


def test_an_async_engine_of_a_config_loads_its_model_on_its_step_thread(
        tiny_model, monkeypatch):
    """Every OpenMP region of the engine, loading included, starts on one thread (see
    AsyncEngine): the model loads on the step thread, the caller gets it loaded, and a
    failed load raises in the caller."""
    import threading

    from inference import EngineConfig, LLMEngine
    from inference.loader import ModelNotFoundError

    loaded_on = []
    original = LLMEngine.__init__

    def recording(self, *args, **kwargs):
        loaded_on.append(threading.current_thread())
        original(self, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "__init__", recording)
    engine = AsyncEngine(EngineConfig(model=str(tiny_model), dtype="float32", num_blocks=32))
    try:
        assert loaded_on == [engine._thread] and loaded_on[0] is not threading.current_thread()
        assert engine.config.model == str(tiny_model) and engine.tokenizer is not None

        async def reply():
            return [o async for o in engine.generate([5, 6, 7], SamplingParams(max_tokens=3))]

        assert asyncio.run(reply())[-1].finished
    finally:
        engine.shutdown()
    with pytest.raises(ModelNotFoundError, match="nonexistent"):
        AsyncEngine(EngineConfig(model="/nonexistent/model-dir"))
