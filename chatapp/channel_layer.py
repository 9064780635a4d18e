"""The Redis channel layer, with one reader a process that nothing cancels.

channels_redis keeps all of a process's sockets in one Redis key, and one of their
receives at a time pops from it (a blocking BZPOPMIN) for all of them. When a socket
closes, channels cancels its receive; if that receive was the one popping, a message
Redis had already handed over (another page's delta, or a reply's message.done) was
dropped between the pop and its backup, and that page waited for ever. A pop that is
let finish instead keeps the closing receive waiting, and dies with an event loop that
closes under it.

Here the pops for the process's key are made by one thread of its own, with a blocking
client of its own, that no socket's cancel reaches: it files each message under its
channel, and a receive only waits for its channel's messages to be filed. Cancelling
a receive then cancels a wait, never a pop, whatever event loop it ran on. Sends, groups
and receives on channels of no process stay channels_redis's own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from typing import Any

import redis
from channels_redis.core import RedisChannelLayer as _RedisChannelLayer

log = logging.getLogger(__name__)

# A process with nobody waiting stops its reader after this many empty pops (seconds
# each); the next receive starts another. Messages sent meanwhile wait in Redis.
IDLE_POPS = 2


class _Mailbox:
    """The process's messages, filed by channel, and who waits for which channel."""

    def __init__(self, capacity: int, expiry: float) -> None:
        self.lock = threading.Lock()
        self.capacity = capacity
        self.expiry = expiry
        self.messages: dict[str, collections.deque] = {}
        # When each channel's messages were last filed or taken: a socket that has gone
        # leaves its late messages behind, dropped once they are `expiry` old.
        self.touched: dict[str, float] = {}
        self.waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}

    def file(self, channel: str, message: dict) -> None:
        with self.lock:
            # As channels_redis's buffer: a full channel drops its oldest message.
            box = self.messages.setdefault(channel, collections.deque(maxlen=self.capacity))
            box.append(message)
            self.touched[channel] = time.monotonic()
            waiting = self.waiters.pop(channel, [])
        for loop, future in waiting:
            # A loop that has closed has nobody left to wake; the message stays filed.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, future)

    def take(self, channel: str) -> dict | None:
        with self.lock:
            box = self.messages.get(channel)
            if not box:
                return None
            message = box.popleft()
            if not box:
                del self.messages[channel]
                del self.touched[channel]
            else:
                self.touched[channel] = time.monotonic()
            return message

    def wait_for(self, channel: str, loop: asyncio.AbstractEventLoop) -> asyncio.Future | None:
        """A future woken when `channel` has a message; None when it has one already."""
        with self.lock:
            if self.messages.get(channel):
                return None
            future = loop.create_future()
            self.waiters.setdefault(channel, []).append((loop, future))
            return future

    def stop_waiting(self, channel: str, future: asyncio.Future) -> None:
        with self.lock:
            waiting = [w for w in self.waiters.get(channel, []) if w[1] is not future]
            if waiting:
                self.waiters[channel] = waiting
            else:
                self.waiters.pop(channel, None)

    def sweep(self) -> None:
        """Drop the messages of channels nobody has come for in `expiry` seconds."""
        stale = time.monotonic() - self.expiry
        with self.lock:
            for channel in [c for c, t in self.touched.items()
                            if t < stale and c not in self.waiters]:
                del self.messages[channel], self.touched[channel]

    def anyone_waiting(self) -> bool:
        with self.lock:
            return bool(self.waiters)

    def clear(self) -> None:
        with self.lock:
            self.messages.clear()
            self.touched.clear()


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class RedisChannelLayer(_RedisChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mailbox = _Mailbox(self.capacity, self.expiry)
        self._reader: threading.Thread | None = None
        self._reader_lock = threading.Lock()

    async def receive(self, channel: str) -> dict:
        assert self.require_valid_channel_name(channel)
        if "!" not in channel:
            return await super().receive(channel)
        real_channel = self.non_local_name(channel)
        assert real_channel.endswith(self.client_prefix + "!"), "Wrong client prefix"
        loop = asyncio.get_running_loop()
        while True:
            message = self._mailbox.take(channel)
            if message is not None:
                return message
            # A cancelled receive leaves what it had not taken yet filed, for the next
            # receive on its channel (a receive cancelled by a timeout is often followed
            # by another); a channel nobody comes back for is swept.
            future = self._mailbox.wait_for(channel, loop)
            if future is None:
                continue
            self._ensure_reader(real_channel)
            try:
                await future
            except BaseException:
                self._mailbox.stop_waiting(channel, future)
                raise

    async def flush(self) -> None:
        self._mailbox.clear()
        await super().flush()

    def _ensure_reader(self, real_channel: str) -> None:
        with self._reader_lock:
            if self._reader is None or not self._reader.is_alive():
                self._reader = threading.Thread(
                    target=self._read, args=(real_channel,), daemon=True,
                    name=f"channel-layer-reader-{self.client_prefix[:8]}")
                self._reader.start()

    def _client(self, real_channel: str) -> redis.Redis:
        host = dict(self.hosts[self.consistent_hash(real_channel)])
        if "address" in host:
            return redis.Redis.from_url(host.pop("address"), **host)
        if "master_name" in host:
            raise ValueError("the channel layer's reader does not speak to Redis Sentinel")
        return redis.Redis(**host)

    def _read(self, real_channel: str) -> None:
        """Pop the process's messages and file them, until nobody waits for a while."""
        key = self.prefix + real_channel
        client = self._client(real_channel)
        idle = 0
        swept = time.monotonic()
        try:
            while True:
                if time.monotonic() - swept > 1.0:
                    self._mailbox.sweep()
                    swept = time.monotonic()
                try:
                    popped = client.bzpopmin(key, timeout=self.brpop_timeout)
                except redis.RedisError:
                    log.warning("channel layer: popping %s failed; trying again", key,
                                exc_info=True)
                    threading.Event().wait(1.0)
                    continue
                if popped is not None:
                    idle = 0
                    self._file(real_channel, popped[1])
                    continue
                idle += 1
                with self._reader_lock:
                    if idle >= IDLE_POPS and not self._mailbox.anyone_waiting():
                        self._reader = None
                        return
        finally:
            client.close()

    def _file(self, real_channel: str, content: bytes) -> None:
        message = self.deserialize(content)
        # group_send names a process's channels in the message itself, one pop for all.
        channels = message.pop("__asgi_channel__", real_channel)
        if not isinstance(channels, list):
            self._mailbox.file(channels, message)  # one socket's: every delta, no copy
            return
        for channel in channels:  # each socket its own copy, free to change it
            self._mailbox.file(channel, dict(message))
