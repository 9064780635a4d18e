"""The chat WebSocket: /ws/chat/<conversation_id>/.

Protocol (JSON text frames).

Client -> server:
  {"type": "send", "content": str, "parent_id": int?}   new turn after parent_id
                                                         (default: the current leaf)
  {"type": "stop", "message_id": int?}                  stop a reply (default: all running),
                                                         also one a Celery worker generates
  {"type": "regenerate", "message_id": int}             new reply beside this reply
  {"type": "continue", "message_id": int}               generate more of a reply cut short
                                                         (interrupted, stopped, length)
  {"type": "edit", "message_id": int, "content": str}   new user message beside this one
  {"type": "select", "message_id": int}                 remember the branch being viewed
  {"type": "ping"}

Server -> client:
  {"type": "hello", "conversation": {...}}                on connect
  {"type": "message.created", "message": {...}}           a user message or a pending reply
                                                         (or a continued one, again pending)
  {"type": "message.started", "message_id", "prompt_tokens", "text"}  text: what a
                                                         continued reply holds already
  {"type": "message.delta", "message_id", "seq", "text"} seq counts 1, 2, 3... per reply
  {"type": "message.resumed", "message_id", "seq", "text"}  on connect, for a reply still
                                                         streaming: its text up to delta
                                                         `seq`; the stream goes on at seq + 1
  {"type": "message.done", "message_id", "seq", "message": {..., "usage": {...}}}
  {"type": "conversation.updated", "conversation": {...}}
  {"type": "error", "code", "message", "request_type"}  the socket stays open; code
                                                         "generation_unavailable": a reply
                                                         for a worker could not be queued
                                                         (the message is kept; regenerate);
                                                         "context_length_exceeded": the
                                                         message alone leaves no room for a
                                                         reply (nothing is stored)
  {"type": "pong"}

Close codes: 4401 not logged in; 4404 no such conversation for this user (another
user's conversation looks the same as a missing one). A cross-origin handshake is
refused by AllowedHostsOriginValidator (HTTP 403 before the socket opens).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from chatapp.accounting.ratelimit import RateLimited, active_limiter
from chatapp.api import json_body
from chatapp.chat import selectors, services
from chatapp.chat.errors import ChatError, InvalidInput, NotFound
from chatapp.chat.payloads import conversation_dict, message_dict
from chatapp.echo import ECHO_MAX_CHARS, quoted
from chatapp.generation import orphans, prompting, replies
from chatapp.generation.events import publish

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
MAX_FRAME_CHARS = 256 * 1024


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.conversation = None
        user = self.scope.get("user")
        # Accept first, then close: only an accepted socket can carry a close code.
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        try:
            self.conversation = await database_sync_to_async(selectors.conversation_get)(
                user=user, conversation_id=self.scope["url_route"]["kwargs"]["conversation_id"]
            )
        except NotFound:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = self.conversation.group_name
        await self.channel_layer.group_add(self.group, self.channel_name)
        # Replies a dead process left streaming are finished as interrupted, text kept.
        await database_sync_to_async(orphans.recover)(conversation=self.conversation)
        await self.send_json({"type": "hello", "conversation": conversation_dict(self.conversation)})
        # Replies generated here go on while no page watches; this one picks up their
        # streams (group events queue behind connect, so none is missed or repeated).
        await self.send_resumed()
        # The conversation's KV comes back from the host/disk tier while the person reads.
        self.prewarming = asyncio.create_task(self.prewarm())

    async def prewarm(self) -> None:
        try:
            await replies.prewarm(self.conversation)
        except Exception:  # a missed prewarm costs one slower turn, never the socket
            log.warning("Prewarming conversation %s failed", self.conversation.pk,
                        exc_info=True)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "prewarming", None) is not None:
            self.prewarming.cancel()
        if self.conversation is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        # A closed page does not stop its replies: only Stop does (they are persisted as
        # they stream, and a page that opens later resumes them).

    async def send_resumed(self) -> None:
        active = await database_sync_to_async(selectors.conversation_active_replies)(
            conversation=self.conversation)
        for reply in active:
            event = replies.resume_event(reply.pk)
            if event is not None:
                await self.send_json(event)

    # -- client events -----------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.conversation is None:
            return
        if text_data is None:
            await self.send_error("bad_request", "Send JSON text frames, not binary.")
            return
        if len(text_data) > MAX_FRAME_CHARS:
            await self.send_error("message_too_long", "The frame is too large.")
            return
        try:
            data = await self.decode_json(text_data)
        except json_body.JSONBodyError as exc:
            await self.send_error("bad_json", exc.message)
            return
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            await self.send_error("bad_request", 'Expected a JSON object with a "type".')
            return
        kind = data["type"]
        handler = self.HANDLERS.get(kind)
        if handler is None:
            # Echoed briefly: the type is whatever the client sent, up to a whole frame.
            await self.send_error("unknown_event", f"Unknown event type {quoted(kind)}.",
                                  kind[:ECHO_MAX_CHARS])
            return
        if kind != "ping" and not await self.conversation_still_exists():
            # Deleted (from another tab, say) since this socket opened.
            await self.close(code=CLOSE_NOT_FOUND)
            return
        try:
            if kind in self.CHANGES:
                # A reply whose process died must not hold the conversation busy.
                await database_sync_to_async(orphans.recover)(conversation=self.conversation)
            if kind in self.GENERATES:
                await database_sync_to_async(active_limiter().hit_user)(self.scope["user"])
            await handler(self, data)
        except RateLimited as exc:
            await self.send_error("rate_limited", f"{exc.message} Try again in "
                                  f"{exc.retry_after} s.", kind)
        except ChatError as exc:
            await self.send_error(exc.code, exc.message, kind)
        except Exception:
            # Not the user's doing: log it, tell the client plainly, keep the socket open.
            log.exception("Handling %r on conversation %s failed", kind, self.conversation.pk)
            await self.send_error(
                "internal_error", "The server could not handle that; please try again.", kind
            )

    async def on_send(self, data: dict) -> None:
        await self.check_fits(data)
        user_msg, reply = await database_sync_to_async(services.message_send)(
            conversation=self.conversation,
            content=data.get("content"),
            parent_id=self.optional_id(data, "parent_id"),
        )
        await self.announce(user_msg, reply)

    async def on_edit(self, data: dict) -> None:
        await self.check_fits(data)
        user_msg, reply = await database_sync_to_async(services.message_edit)(
            conversation=self.conversation,
            message_id=self.required_id(data),
            content=data.get("content"),
        )
        await self.announce(user_msg, reply)

    async def on_regenerate(self, data: dict) -> None:
        reply = await database_sync_to_async(services.message_regenerate)(
            conversation=self.conversation, message_id=self.required_id(data)
        )
        await self.announce(reply)

    async def on_continue(self, data: dict) -> None:
        reply = await database_sync_to_async(services.message_continue)(
            conversation=self.conversation, message_id=self.required_id(data)
        )
        await self.announce(reply)

    async def on_stop(self, data: dict) -> None:
        message_id = self.optional_id(data, "message_id")
        if message_id is None:
            stopping = await database_sync_to_async(selectors.conversation_active_replies)(
                conversation=self.conversation
            )
        else:
            stopping = [await database_sync_to_async(selectors.message_get)(
                conversation=self.conversation, message_id=message_id
            )]
        for reply in stopping:
            await database_sync_to_async(replies.request_stop)(reply.pk)

    async def on_select(self, data: dict) -> None:
        await database_sync_to_async(services.conversation_select_leaf)(
            conversation=self.conversation, message_id=self.required_id(data)
        )

    async def on_ping(self, data: dict) -> None:
        await self.send_json({"type": "pong"})

    CHANGES = ("send", "edit", "regenerate", "continue", "stop")
    # Those that start a reply: counted against the user's limits and token budgets.
    GENERATES = ("send", "edit", "regenerate", "continue")
    HANDLERS = {
        "send": on_send,
        "edit": on_edit,
        "regenerate": on_regenerate,
        "continue": on_continue,
        "stop": on_stop,
        "select": on_select,
        "ping": on_ping,
    }

    @classmethod
    async def decode_json(cls, text_data: str) -> object:
        # The one bounded decoder HTTP bodies use too: a frame nested 100 000 deep is an
        # error event here, not a RecursionError that closes the socket (1011).
        return json_body.loads(text_data)

    # -- group events ------------------------------------------------------

    async def chat_event(self, event: dict) -> None:
        await self.send_json(event["event"])

    # -- helpers -----------------------------------------------------------

    async def announce(self, *messages) -> None:
        """Tell every tab about the new messages, then start generating the reply (here
        or on a worker); it goes on when this socket closes."""
        await database_sync_to_async(self.conversation.refresh_from_db)()
        for message in messages:
            await publish(self.group, {"type": "message.created", "message": message_dict(message)})
        await publish(self.group, {"type": "conversation.updated",
                                   "conversation": conversation_dict(self.conversation)})
        (await replies.start(messages[-1])).run()

    async def check_fits(self, data: dict) -> None:
        """A message too long for the context is refused before anything is stored."""
        await database_sync_to_async(prompting.check_new_message)(
            conversation=self.conversation, content=data.get("content"))

    async def conversation_still_exists(self) -> bool:
        try:
            await database_sync_to_async(self.conversation.refresh_from_db)()
        except self.conversation.DoesNotExist:
            return False
        return True

    @staticmethod
    def optional_id(data: dict, key: str) -> int | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, bool) and isinstance(value, int | str):
            with contextlib.suppress(ValueError):
                return int(value)
        raise InvalidInput(f'"{key}" must be a message id.')

    @classmethod
    def required_id(cls, data: dict) -> int:
        value = cls.optional_id(data, "message_id")
        if value is None:
            raise InvalidInput('"message_id" is required.')
        return value

    async def send_error(self, code: str, message: str, request_type: str | None = None) -> None:
        await self.send_json(
            {"type": "error", "code": code, "message": message, "request_type": request_type}
        )
