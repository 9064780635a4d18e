"""History longer than the context: the prompt manager leaves out the oldest whole turns,
in one large step, behind a block-padded marker, so a long chat misses the cache once per
cut and extends its prompt every turn in between (chatapp.prompts.history)."""

from __future__ import annotations

import random

import pytest

from chatapp.prompts.compare import first_divergence
from chatapp.prompts.errors import ContextExceeded
from chatapp.prompts.formats import list_formats
from chatapp.prompts.history import ContextLimit, first_kept_turn
from chatapp.prompts.services import PromptBuilder

from .conftest import char_split

TEXT = ("the cache keeps every block whose whole prefix it computed before so a chat "
        "that extends its prompt pays only for new tokens while one that rewrites its "
        "history pays for all of them again and again")
WORDS = TEXT.split(" ")


def sharegpt_like(rng: random.Random) -> str:
    """A user message of ordinary length: mostly short, now and then a long paste."""
    n = rng.choice([4, 8, 12, 20, 30, 45]) if rng.random() > 0.1 else rng.randint(80, 140)
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "?"


# -- the rule, over lengths ---------------------------------------------------------------


def test_nothing_is_left_out_while_the_prompt_fits():
    limit = ContextLimit(max_model_len=1000, reply_tokens=100)
    assert first_kept_turn([100] * 5, [10] * 6, fixed=50, marker=16, limit=limit) == (0, 0)


def test_a_cut_goes_down_to_the_target_in_one_step_and_then_holds():
    limit = ContextLimit(max_model_len=1000, reply_tokens=100, target=0.5)
    # Turn 9's prompt would be 50 + 9 * 100 + 10 = 960 tokens: no room for its reply.
    first, before = first_kept_turn([100] * 9, [10] * 10, fixed=50, marker=16, limit=limit)
    assert before == 0 and first == 5  # 50 + 16 + 4 * 100 + 10 = 476 <= 500 < 576
    # The next turns keep that cut until it no longer fits: no cut every turn.
    for n in (10, 11, 12, 13):
        assert first_kept_turn([100] * n, [10] * (n + 1), fixed=50, marker=16,
                               limit=limit) == (5, 5)
    assert first_kept_turn([100] * 14, [10] * 15, fixed=50, marker=16, limit=limit)[0] == 10


def test_a_turn_longer_than_the_target_leaves_everything_before_it_out():
    limit = ContextLimit(max_model_len=1000, reply_tokens=100)
    first, _ = first_kept_turn([100, 100, 100], [10, 10, 10, 700], fixed=50, marker=16,
                               limit=limit)
    assert first == 3


def test_context_limit_checks_its_values():
    with pytest.raises(ValueError):
        ContextLimit(max_model_len=100, reply_tokens=10, target=0)
    with pytest.raises(ValueError):
        ContextLimit(max_model_len=100, reply_tokens=-1)


# -- the marker -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list_formats(), ids=lambda f: f.name)
def test_the_marker_ends_on_a_block_after_the_system_segment_in_every_format(tokenizer, fmt):
    builder = PromptBuilder(tokenizer, block_size=16, chat_format=fmt)
    system = builder.system_segment_for_text("You are a helpful assistant.")
    marker = builder.marker_segment()
    assert len(system) % 16 == 0 and len(marker) % 16 == 0
    assert "left out" in tokenizer.decode(marker)
    assert builder.marker_segment() == marker  # one encoding, the same every time
    opening = builder.marker_segment(after_system=False)
    assert len(opening) % 16 == 0


# -- prompts -----------------------------------------------------------------------------


def _converse(builder: PromptBuilder, system: list[int], limit: ContextLimit, turns: int,
              seed: int = 0):
    """A conversation as the chat service builds it, replies of made-up generated ids;
    yields (plan, history before it, reply segment)."""
    rng = random.Random(seed)
    history: list[list[int]] = []
    stop = builder.stop_token_ids
    for _ in range(turns):
        plan = builder.build(system, history, sharegpt_like(rng), limit=limit)
        reply = char_split(builder.tokenizer, sharegpt_like(rng))[: rng.randint(4, 40)] + stop
        segment = builder.assistant_segment(reply, True)
        yield plan, list(history), segment
        history += [list(plan.new_user_segment), segment]


def test_a_long_conversation_cuts_whole_turns_behind_the_marker(builder):
    system = builder.system_segment_for_text("You are a helpful assistant.")
    marker = builder.marker_segment()
    limit = ContextLimit(max_model_len=1024, reply_tokens=64)
    header = len(builder.generation_prompt())
    previous: tuple[int, ...] = ()
    cuts = 0
    for plan, history, reply in _converse(builder, system, limit, 120):
        ids = plan.token_ids
        assert len(ids) + limit.reply_tokens <= limit.max_model_len
        if plan.cut is None:
            assert not history or ids[: len(previous)] == previous
        else:
            cut = plan.cut
            # Whole turns: a user message with its reply, never half of one.
            assert cut.turns * 2 == cut.messages and cut.marker_tokens == len(marker)
            assert cut.tokens == sum(len(seg) for seg in history[: cut.messages])
            assert ids[: len(system) + len(marker)] == tuple(system + marker)
            kept = ids[len(system) + len(marker):]
            assert kept[: len(history[cut.messages])] == tuple(history[cut.messages])
            kinds = [seg.kind for seg in plan.segments]
            assert kinds[:3] == ["system", "cut", "history"]
            if cut.new:
                cuts += 1
                assert len(ids) <= limit.max_model_len // 2  # down to the target at once
            else:
                # The marker and the kept turns are the previous prompt's, token for token.
                assert first_divergence(previous, ids) == len(previous)
        previous = tuple(ids[:-header]) + tuple(reply)
    assert 3 <= cuts <= 120 // 5


def test_a_message_that_alone_leaves_no_room_is_refused(builder):
    system = builder.system_segment_for_text("You are a helpful assistant.")
    limit = ContextLimit(max_model_len=128, reply_tokens=16)
    with pytest.raises(ContextExceeded, match=r"needs \d+ prompt tokens .* holds 128") as caught:
        builder.build(system, [], " ".join(["word"] * 200), limit=limit)
    assert caught.value.max_model_len == 128 and caught.value.prompt_tokens > 128


def test_the_stateless_path_keeps_the_same_turns_as_the_stored_one(builder):
    """/v1 with truncation "auto", sending a conversation back as text with its replies'
    ids remembered, gets the conversation's own prompt, cut at the same turn."""
    system_text = "You are a helpful assistant."
    system = builder.system_segment_for_text(system_text)
    limit = ContextLimit(max_model_len=768, reply_tokens=48)
    rng = random.Random(7)
    stored: list[list[int]] = []
    turns: list[tuple[str, str]] = [("system", system_text)]
    generated: dict[str, list[int]] = {}
    plan = None
    for i in range(40):
        text = sharegpt_like(rng)
        plan = builder.build(system, stored, text, limit=limit)
        stateless = builder.build_from_turns(turns + [("user", text)], limit=limit,
                                             assistant_ids_lookup=generated.get)
        assert stateless.token_ids == plan.token_ids, f"turn {i}"
        assert stateless.cut == plan.cut
        reply_text = f"Reply {i}: " + sharegpt_like(rng)
        ids = builder.encoder.untrusted(reply_text) + builder.stop_token_ids
        generated[reply_text] = ids
        stored += [list(plan.new_user_segment), builder.assistant_segment(ids, True)]
        turns += [("user", text), ("assistant", reply_text)]
    assert plan is not None and plan.cut is not None


def test_tool_calls_stay_with_their_results(builder):
    """A turn is a user message with all that answers it: calls and their results (which
    the hermes convention writes as user turns) are left out together or kept together."""
    limit = ContextLimit(max_model_len=512, reply_tokens=32)
    turns: list[tuple[str, str]] = [("system", "You call tools.")]
    starts: set[int] = set()
    rng = random.Random(3)
    for i in range(30):
        starts.add(len(turns))
        turns.append(("user", sharegpt_like(rng)))
        if i % 2:
            turns.append(("assistant", f'<tool_call>\n{{"name": "look", "arguments": {{"n": {i}}}}}'
                          "\n</tool_call>"))
            turns.append(("user", f"<tool_response>\nresult {i}\n</tool_response>"))
        turns.append(("assistant", f"Answer {i}."))
    starts.add(len(turns))
    turns.append(("user", "And now?"))
    plan = builder.build_from_turns(turns, limit=limit, turn_starts=starts)
    assert plan.cut is not None and plan.cut.turns > 0
    # The first kept message is where a turn starts: a user's own message, not a result.
    first_kept = 1 + plan.cut.messages
    assert first_kept in starts
    start = next(seg.start for seg in plan.segments if seg.kind == "history")
    kept = builder.tokenizer.decode(list(plan.token_ids[start:]))
    assert kept.startswith("<|im_start|>user\n") and not kept.startswith(
        "<|im_start|>user\n<tool_response>")


# -- a 200-turn conversation on a real engine ---------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    """The tiny random model (SmolLM2's tokenizer) with a 1,024-token context."""
    from inference import EngineConfig, LLMEngine
    from tests.inference.conftest import make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("tiny-history"), "llama")
    return LLMEngine(EngineConfig(model=str(model), dtype="float32", num_blocks=256,
                                  max_model_len=1024))


def test_a_200_turn_chat_answers_every_turn_and_misses_once_per_cut(tiny_engine, builder):
    from inference import SamplingParams

    engine = tiny_engine
    limit = ContextLimit(max_model_len=engine.max_model_len, reply_tokens=24)
    params = SamplingParams(max_tokens=24, temperature=0.0,
                            stop_token_ids=builder.stop_token_ids)
    system = builder.system_segment_for_text("You are a helpful assistant.")
    rng = random.Random(11)
    history: list[list[int]] = []
    header = len(builder.generation_prompt())
    cacheable = 0  # what the previous turn left in the cache, in whole blocks
    cuts = misses = cached = prompted = 0
    previous: tuple[int, ...] = ()
    for turn in range(200):
        plan = builder.build(system, history, sharegpt_like(rng), limit=limit)
        (out,) = engine.generate([list(plan.token_ids)], params)[0]
        assert out.finish_reason in ("stop", "length") and out.token_ids, f"turn {turn}"
        new_cut = plan.cut is not None and plan.cut.new
        if turn:
            miss = out.cached_tokens < 0.9 * cacheable
            assert miss == new_cut, f"turn {turn}: cached {out.cached_tokens} of {cacheable}"
            misses += miss
        if plan.cut is not None and not new_cut:
            assert first_divergence(previous, plan.token_ids) == len(previous)
        cuts += new_cut
        cached += out.cached_tokens
        prompted += out.prompt_tokens
        segment = builder.assistant_segment(out.token_ids, out.finish_reason == "stop")
        history += [list(plan.new_user_segment), segment]
        previous = tuple(plan.token_ids[:-header]) + tuple(segment)
        cacheable = (len(previous) - 1) // 16 * 16
    assert misses == cuts and 0 < cuts <= 200 // 5
    assert cached / prompted >= 0.85


def test_a_cut_conversation_keeps_a_routing_key_of_its_own_between_cuts(builder):
    """Workers' affinity names a stateless conversation by its first message after the
    system prompt; after a cut, by its first kept message, not the marker every cut
    conversation shares."""
    from chatapp.generation.router import conversation_key

    system = builder.system_segment_for_text("You are a helpful assistant.")
    limit = ContextLimit(max_model_len=1024, reply_tokens=64)
    keys = {}
    for seed in (1, 2):
        for plan, _, _ in _converse(builder, system, limit, 60, seed=seed):
            if plan.cut is not None:
                keys.setdefault(seed, set()).add(
                    (plan.cut.turns, conversation_key(cache_salt="t", plan=plan)))
    # One key per cut of each conversation, none shared between the two.
    for seed in (1, 2):
        assert len({k for _, k in keys[seed]}) == len({turns for turns, _ in keys[seed]}) > 1
    assert not {k for _, k in keys[1]} & {k for _, k in keys[2]}
