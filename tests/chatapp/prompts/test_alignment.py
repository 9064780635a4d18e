"""Acceptance 3: every preset's system segment fills whole 16-token blocks, and two
conversations with the same preset share exactly those blocks."""

from __future__ import annotations

import hashlib

import pytest

from chatapp.prompts.presets import list_presets
from chatapp.prompts.services import PromptBuilder, prefix_hash
from tests.chatapp.prompts.conftest import common_prefix_len, v1_turns

BLOCK = 16
PRESET_IDS = [p.id for p in list_presets()]


def block_hashes(ids, block_size=BLOCK):
    """Chained full-block hashes, as the engine's prefix cache computes them."""
    parent, out = b"", []
    for start in range(0, len(ids) - len(ids) % block_size, block_size):
        block = ",".join(map(str, ids[start : start + block_size])).encode()
        parent = hashlib.sha256(parent + block).digest()
        out.append(parent)
    return out


def shared_blocks(a, b) -> int:
    return common_prefix_len(block_hashes(a), block_hashes(b))


def test_at_least_three_presets_ship():
    assert {"general", "coding", "support"} <= set(PRESET_IDS)
    assert PRESET_IDS[0] == "general"  # front-matter `order`: the default choice comes first
    support = next(p for p in list_presets() if p.id == "support")
    assert "product_name" in support.variables


@pytest.mark.parametrize("preset_id", PRESET_IDS)
def test_system_segment_fills_whole_blocks_and_is_shared(builder, preset_id):
    system = builder.system_segment(preset_id)
    assert len(system) % BLOCK == 0 and len(system) >= BLOCK

    a = builder.build(system, [], "Hi there")
    b = builder.build(system, [], "Tell me a joke about databases")
    for plan in (a, b):
        assert plan.shared_prefix_len == len(system)
        assert plan.token_ids[: len(system)] == tuple(system)
        assert plan.preset_id == preset_id and plan.preset_version
        assert plan.prefix_hash == prefix_hash(system)
    # The two conversations share the system blocks and not one block more: after the
    # system segment both continue with the user header (3 tokens), too few for a block.
    assert shared_blocks(a.token_ids, b.token_ids) == len(system) // BLOCK
    shared_tokens = common_prefix_len(a.token_ids, b.token_ids)
    assert shared_tokens // BLOCK * BLOCK == len(system)


def test_same_preset_same_variables_same_blocks_other_values_other_blocks(builder):
    acme = builder.system_segment("support", variables={"product_name": "Acme"})
    again = builder.system_segment("support", None, {"product_name": "Acme"})
    other = builder.system_segment("support", variables={"product_name": "Globex"})
    assert acme == again
    assert acme != other
    assert len(acme) % BLOCK == 0 and len(other) % BLOCK == 0


def test_block_size_comes_from_the_engine_settings(tokenizer, settings):
    settings.LLM_BLOCK_SIZE = 32
    wide = PromptBuilder(tokenizer)
    assert wide.block_size == 32
    assert len(wide.system_segment("general")) % 32 == 0


def test_api_system_message_with_the_preset_text_shares_the_preset_blocks(builder):
    from chatapp.prompts.presets import get_preset

    text = get_preset("coding").render()
    plan = builder.build_from_turns(v1_turns(
        [{"role": "system", "content": text}, {"role": "user", "content": "hi"}]
    ))
    system = builder.system_segment("coding")
    assert plan.shared_prefix_len == len(system)
    assert plan.token_ids[: len(system)] == tuple(system)
