"""Plain dicts for the page and the WebSocket events (one shape for both)."""

from __future__ import annotations

from chatapp.chat.models import Conversation, Message


def usage_dict(message: Message) -> dict | None:
    if message.role != Message.Role.ASSISTANT or message.prompt_tokens is None:
        return None
    usage = {
        "prompt_tokens": message.prompt_tokens,
        "cached_tokens": message.cached_tokens or 0,
        "completion_tokens": message.completion_tokens or 0,
        "ttft_ms": None if message.ttft is None else round(message.ttft * 1000, 1),
    }
    if message.prefix_cache:
        # The cache receipt: why the prefix-cache match ended where it did. Receipts
        # stored by older versions may say "salt" (another tenant had those tokens): that
        # is the tenant's own "cold", and nothing about another tenant is shown.
        receipt = dict(message.prefix_cache)
        if receipt.get("reason") == "salt":
            receipt["reason"] = "cold"
        usage["prefix_cache"] = receipt
    return usage


def message_dict(message: Message) -> dict:
    return {
        "id": message.pk,
        "conversation_id": message.conversation_id,
        "parent_id": message.parent_id,
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "finish_reason": message.finish_reason or None,
        "error": message.error or None,
        "usage": usage_dict(message),
        "served_by": message.served_by or None,
        "can_continue": message.can_continue,
        "created_at": message.created_at.isoformat() if message.created_at else None,
    }


def conversation_dict(conversation: Conversation) -> dict:
    return {
        "id": conversation.pk,
        "title": conversation.title,
        "preset_id": conversation.preset_id,
        "preset_version": conversation.preset_version,
        "current_leaf_id": conversation.current_leaf_id,
        "updated_at": conversation.updated_at.isoformat() if conversation.updated_at else None,
    }
