"""The Redis channel layer against a real Redis: a socket that closes while its receive
is the one popping for the whole process does not take another socket's message with
it (a page then never got its reply's message.done)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from chatapp.channel_layer import RedisChannelLayer


@pytest.fixture
def redis_url():
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("needs REDIS_URL")
    # A database of its own: the pops this test waits for are its own.
    return url.rsplit("/", 1)[0] + "/11"


def layer_on(url: str) -> RedisChannelLayer:
    # As settings.py makes it: reads wait longer than channels_redis's 5 s pops.
    return RedisChannelLayer(hosts=[{"address": url, "socket_timeout": 30}])


def blocked_in_a_pop(url: str) -> bool:
    import redis

    clients = redis.Redis.from_url(url).client_list()
    return any(c.get("cmd") == "bzpopmin" and c.get("db") == "11" for c in clients)


def send_from_another_process(url: str, channel: str, message: dict) -> None:
    """Another process's send, done while this one's event loop stands still."""
    def run():
        asyncio.run(layer_on(url).send(channel, message))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


async def test_a_receive_cancelled_while_it_pops_for_the_process_loses_nothing(redis_url):
    layer = layer_on(redis_url)
    closing = await layer.new_channel()
    watching = await layer.new_channel()
    popping = asyncio.create_task(layer.receive(closing))
    waiting = asyncio.create_task(layer.receive(watching))
    while not blocked_in_a_pop(redis_url):
        await asyncio.sleep(0.01)  # until one receive pops from Redis for both
    # The message reaches Redis, which hands it to the blocked pop, before this loop runs
    # again: the order the race needs, held still by not yielding.
    send_from_another_process(redis_url, watching, {"type": "chat.event", "n": 1})
    time.sleep(0.2)
    popping.cancel()  # `closing`'s socket went away (its receive holds the pop: the first)
    message = await asyncio.wait_for(waiting, 10)
    assert message == {"type": "chat.event", "n": 1}
    await layer.flush()
