"""The chat workload's usual shape, which the chat benchmarks share: the in-process
run (multiturn), the HTTP client (serve), the server comparisons (llamacpp, memory)
and the new-chat burst (shared-prefix). A command's own sizes start from these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatShape:
    conversations: int
    turns: int
    system_tokens: int
    user_tokens: int
    reply_tokens: int


# 16 conversations of 6 turns on a 512-token system prompt, 60-token user turns and
# 64-token replies: the workload docs/benchmarks.md's chat figures come from.
CHAT = ChatShape(conversations=16, turns=6, system_tokens=512, user_tokens=60, reply_tokens=64)
# --quick: about a minute in process on a small CPU.
QUICK_CHAT = ChatShape(conversations=4, turns=3, system_tokens=128, user_tokens=24, reply_tokens=8)
