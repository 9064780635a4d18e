"""Acceptance 5: `prompts profile` shows where prompts that look alike diverge; two prompts
differing only by an extra hidden token at the front diverge at index 0."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from chatapp.prompts import profile


@pytest.fixture
def prompt(builder):
    system = builder.system_segment("general")
    return list(builder.build(system, [], "What is the prefix cache?").token_ids)


@pytest.fixture(autouse=True)
def empty_ring():
    profile.clear_recent_prompts()
    yield
    profile.clear_recent_prompts()


@pytest.mark.parametrize("hidden", [[0], "\u200b"], ids=["endoftext", "zero-width-space"])
def test_an_extra_hidden_token_at_the_front_diverges_at_index_0(tokenizer, prompt, hidden):
    extra = (
        hidden if isinstance(hidden, list) else tokenizer.encode(hidden, add_special_tokens=False)
    )
    other = extra + prompt
    report = profile.profile_prompts([prompt, other], tokenizer=tokenizer, width=64, block_size=16)
    # They share no block, so they fall in two groups, yet they look alike.
    assert len(report.groups) == 2
    (d,) = report.divergences
    assert (d.a, d.b, d.index, d.look_alike) == (0, 1, 0, True)
    text = report.render_text()
    assert "#1 vs #2 (look alike): diverge at index 0" in text
    row0 = next(line for line in text.splitlines() if line.lstrip("* ").startswith("0 "))
    assert row0.startswith("*")  # row 0 is marked as differing


def test_profile_command_reads_prompts_from_jsonl(tmp_path, command_tokenizer, prompt, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        json.dumps(prompt) + "\n" + json.dumps({"token_ids": [0, *prompt], "label": "extra"}) + "\n"
    )
    call_command("prompts", "profile", "--file", str(path))
    out = capsys.readouterr().out
    assert "diverge at index 0" in out
    assert "<|im_start|>" in out and "<|endoftext|>" in out  # decoded pieces side by side


def test_recent_prompts_are_grouped_by_shared_prefix(builder, tokenizer):
    system = builder.system_segment("support")
    first = builder.build(system, [], "My login fails")
    history = [list(first.new_user_segment), builder.assistant_segment([19556, 2], True)]
    second = builder.build(system, history, "Still failing")
    other = builder.build(builder.system_segment("coding"), [], "Sort a list")
    for plan in (first, second, other):
        profile.record_prompt(plan)
    recent = profile.recent_prompts()
    assert [r.total_tokens for r in recent] == [
        first.prompt_tokens,
        second.prompt_tokens,
        other.prompt_tokens,
    ]
    assert recent[0].preset_id == "support" and recent[0].prefix_hash == first.prefix_hash

    report = profile.profile_prompts(recent, tokenizer=tokenizer, block_size=16)
    support_group = next(g for g in report.groups if 0 in g.members)
    assert support_group.members == [0, 1]
    assert support_group.shared_tokens == first.prompt_tokens  # turn 2 extends turn 1 entirely
    d = next(d for d in report.divergences if (d.a, d.b) == (0, 1))
    assert d.index == first.prompt_tokens  # #1 ends where #2 goes on
    assert "share" in report.render_text() and "preset support@" in report.render_text()


def test_ring_buffer_is_bounded(tokenizer):
    for n in range(profile.RING_SIZE + 10):
        profile.record_prompt([1, 2, n])
    recent = profile.recent_prompts()
    assert len(recent) == profile.RING_SIZE
    assert recent[-1].token_ids == (1, 2, profile.RING_SIZE + 9)
    assert len(profile.recent_prompts(limit=5)) == 5


def test_profile_without_prompts_says_so(command_tokenizer, capsys):
    call_command("prompts", "profile")
    assert "No prompts to profile" in capsys.readouterr().out


def test_bad_jsonl_is_a_clear_error(tmp_path, command_tokenizer):
    from django.core.management.base import CommandError

    path = tmp_path / "bad.jsonl"
    path.write_text('{"token_ids": "oops"}\n')
    with pytest.raises(CommandError, match=r"bad.jsonl:1: not a prompt"):
        call_command("prompts", "profile", "--file", str(path))
