"""The conversations API's reads that shape data (tree, export) and its reply stream;
writes go through chatapp.chat.services and chatapp.generation.replies."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from channels.layers import get_channel_layer
from django.db.models import Count, QuerySet

from chatapp.chat import selectors as chat_selectors
from chatapp.chat.models import Conversation, Message
from chatapp.generation import orphans, replies


def conversation_queryset(
    *, user, search: str = "", preset_id: str | None = None, ordering: str = "-updated_at",
    archived: bool | None = None, pinned: bool | None = None, tag: str = "",
) -> QuerySet[Conversation]:
    qs = chat_selectors.conversation_list(user=user, search=search, archived=archived, tag=tag)
    if preset_id:
        qs = qs.filter(preset_id=preset_id)
    if pinned is not None:
        qs = qs.filter(pinned=pinned)
    return (qs.annotate(message_count=Count("messages")).prefetch_related("tags")
            .order_by(ordering, "-id"))


def children_map(messages: list[Message]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for m in messages:
        if m.parent_id is not None:
            children.setdefault(m.parent_id, []).append(m.pk)
    return children


def message_tree(*, conversation: Conversation) -> dict:
    """Every message (all branches) with its parent and children: the tree in flat form.
    A reply whose process died reads interrupted (a read writes nothing)."""
    messages = orphans.as_read(chat_selectors.conversation_messages(conversation=conversation),
                               conversation=conversation)
    return {
        "conversation_id": conversation.pk,
        "current_leaf_id": conversation.current_leaf_id,
        "root_ids": [m.pk for m in messages if m.parent_id is None],
        "messages": messages,
        "children": children_map(messages),
    }


def export_data(*, conversation: Conversation) -> dict:
    messages = chat_selectors.conversation_messages(conversation=conversation)
    replies = [m for m in messages if m.role == Message.Role.ASSISTANT and m.prompt_tokens]
    branch = chat_selectors.current_branch(conversation=conversation)
    return {
        "conversation": conversation,
        "current_branch_ids": [m.pk for m in branch],
        "messages": messages,
        "children": children_map(messages),
        "usage": {
            "prompt_tokens": sum(m.prompt_tokens or 0 for m in replies),
            "cached_tokens": sum(m.cached_tokens or 0 for m in replies),
            "completion_tokens": sum(m.completion_tokens or 0 for m in replies),
            "replies": len(replies),
        },
    }


def export_markdown(*, conversation: Conversation) -> str:
    """The current branch, for people: headings per turn, the text as written."""
    branch = chat_selectors.current_branch(conversation=conversation)
    total = Message.objects.filter(conversation=conversation).count()
    lines = [f"# {conversation.title or f'Conversation {conversation.pk}'}", ""]
    lines.append(f"_Preset: {conversation.preset_id} {conversation.preset_version}_".rstrip())
    if total > len(branch):
        lines.append(f"_Current branch: {len(branch)} of {total} messages._")
    if conversation.system_prompt:
        lines += ["", "## System prompt", "", conversation.system_prompt]
    lines.append("")
    for m in branch:
        who = "User" if m.role == Message.Role.USER else "Assistant"
        note = "" if m.status == Message.Status.DONE else f" ({m.status})"
        lines += [f"## {who}{note}", "", m.content or "", ""]
    return "\n".join(lines).rstrip() + "\n"


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def reply_stream(
    *, started: replies.Started, group: str, first: dict, on_close: Callable[[], None],
) -> AsyncIterator[bytes]:
    """Generate reply `reply_id` and relay its events, from the chat page's own group (a
    page watching the conversation sees the reply too), as server-sent events. A client
    that goes away stops nothing, as a closed chat page does not: the reply goes on and is
    stored as it streams (GET the message, or open the chat page, which resumes it); only
    Stop stops it. The key's slot is held until the reply ends."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    # A reply queued for a worker (remote) streams through the same group.
    reply_id = started.reply_id
    task = started.run()
    try:
        yield _sse("message.created", first)
        while True:
            message = await layer.receive(channel)
            event = message.get("event") or {}
            if event.get("message_id") != reply_id:
                continue
            yield _sse(event.get("type", "message"), event)
            if event.get("type") == "message.done":
                break
        if task is not None:
            await task
    finally:
        await layer.group_discard(group, channel)
        if task is not None and not task.done():
            # Unwatched, the reply still counts against the key until it ends: leaving
            # the stream is no way around the key's concurrency limit.
            task.add_done_callback(lambda _: on_close())
        else:
            on_close()
