"""The Redis channel layer, minus one way to lose a message.

channels_redis keeps all of a process's sockets in one Redis key, and one of their
receives at a time pops from it for all of them. When a socket closes while its receive
is the one popping, channels cancels that receive: a message Redis had popped already
(for another socket of the process: a delta, or a reply's message.done) was dropped,
and that page waited forever. Here the pop is let finish, so what it took goes back to
Redis, in order, for the next receive (a closing socket's receive may take up to a
pop's timeout, 1 s here, to end).
"""

from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer


class RedisChannelLayer(_RedisChannelLayer):
    # How long a closing socket's receive may wait for its pop to end (5 s upstream).
    brpop_timeout = 1

    async def _brpop_with_clean(self, index, channel, timeout):
        # channels_redis keeps what a pop took in a backup queue, which the next pop puts
        # back in front, in order, unless the message was processed: safe, except when
        # the cancel lands between Redis handing the message over and the backup. So the
        # pop is not cancelled: it ends (within `timeout`), then the cancel goes on.
        pop = asyncio.ensure_future(super()._brpop_with_clean(index, channel, timeout))
        try:
            return await asyncio.shield(pop)
        except asyncio.CancelledError:
            while not pop.done():
                try:
                    await asyncio.shield(pop)
                except asyncio.CancelledError:
                    continue
                except Exception:
                    break
            raise
