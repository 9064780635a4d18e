"""The Redis channel layer against a real Redis: a socket that closes while a pop for the
whole process is under way does not take another socket's message with it (a page then
never got its reply's message.done), and a receive given up on a loop that closes
leaves the layer working."""

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


def test_a_receive_cancelled_on_a_loop_that_closes_leaves_the_layer_working(redis_url):
    """A receive given up by a timeout, on an event loop that then closes (as async_to_sync
    and test drains do), neither hangs the next receive nor loses what comes after."""
    layer = layer_on(redis_url)
    channel = asyncio.run(layer.new_channel())

    async def give_up():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(channel), 0.2)

    asyncio.run(give_up())

    async def send_and_receive():
        await layer.send(channel, {"type": "chat.event", "n": 2})
        return await asyncio.wait_for(layer.receive(channel), 10)

    assert asyncio.run(send_and_receive()) == {"type": "chat.event", "n": 2}
    asyncio.run(layer.flush())


async def test_a_group_send_reaches_each_channel_of_the_process_once(redis_url):
    layer = layer_on(redis_url)
    channels = [await layer.new_channel() for _ in range(3)]
    for channel in channels:
        await layer.group_add("watchers", channel)
    await layer.group_send("watchers", {"type": "chat.event", "n": 3})
    await layer.group_send("watchers", {"type": "chat.event", "n": 4})
    for channel in channels:
        got = [await asyncio.wait_for(layer.receive(channel), 10) for _ in range(2)]
        assert [m["n"] for m in got] == [3, 4]
    await layer.flush()


async def test_messages_of_a_channel_nobody_comes_back_for_are_dropped(redis_url):
    layer = RedisChannelLayer(hosts=[{"address": redis_url, "socket_timeout": 30}], expiry=1)
    gone, staying = await layer.new_channel(), await layer.new_channel()
    waiting = asyncio.create_task(layer.receive(staying))
    await layer.send(gone, {"type": "chat.event", "n": 5})
    while gone not in layer._mailbox.messages:
        await asyncio.sleep(0.05)
    while gone in layer._mailbox.messages:  # swept by the reader once a second or so
        await asyncio.sleep(0.1)
    await layer.send(staying, {"type": "chat.event", "n": 6})
    assert (await asyncio.wait_for(waiting, 10))["n"] == 6
    await layer.flush()
