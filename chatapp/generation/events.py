"""A reply's events on its conversation's channel-layer group, in numbered batches.

A reply streams as `message.delta` events carrying a sequence number each, a few
tokens per event: channels_redis drops messages to a full channel without a word (its
capacity, CHANNEL_CAPACITY, counts all of a process's sockets together), so per-token
events would crowd it under load, and a client that sees a gap in the numbers knows to
reload the stored message.
"""

from __future__ import annotations

import time

from channels.layers import get_channel_layer


async def publish(group: str, event: dict) -> None:
    """Send `event` to the group; consumers (chat_event) pass it to the client as it is."""
    await get_channel_layer().group_send(group, {"type": "chat.event", "event": event})


class DeltaBatcher:
    """Collects text deltas; says when a batch is due (enough tokens or enough time)."""

    def __init__(self, batch_tokens: int, flush_s: float):
        self.batch_tokens = max(1, batch_tokens)
        self.flush_s = flush_s
        self.text = ""
        self.tokens = 0
        self.seq = 0
        self.last_flush = time.monotonic()

    def add(self, text: str, n_tokens: int) -> None:
        self.text += text
        self.tokens += n_tokens

    def due(self) -> bool:
        return bool(self.text) and (self.tokens >= self.batch_tokens
                                    or time.monotonic() - self.last_flush >= self.flush_s)

    def take(self) -> tuple[int, str]:
        self.seq += 1
        text, self.text, self.tokens = self.text, "", 0
        self.last_flush = time.monotonic()
        return self.seq, text
