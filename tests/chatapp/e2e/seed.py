"""Run inside the live server's environment (its database): make users and sessions.

    python tests/chatapp/e2e/seed.py users N PREFIX [PASSWORD]
        -> JSON list of {username, user_id, sessionid, conversation_id}
    python tests/chatapp/e2e/seed.py reply CONVERSATION_ID CONTENT
        -> stores a finished assistant reply with CONTENT (a model reply as the page
           will find it in the database) after the conversation's latest message
    python tests/chatapp/e2e/seed.py interrupted CONVERSATION_ID CONTENT
        -> the same, as a reply its process left interrupted

Without PASSWORD, users get an unusable password and a ready session (like force_login),
which keeps 30 users from costing 30 slow password hashes.
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import (  # noqa: E402
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,  # noqa: E402
)
from django.contrib.sessions.backends.db import SessionStore  # noqa: E402

from chatapp.chat import selectors, services  # noqa: E402
from chatapp.chat.models import Conversation, Message  # noqa: E402
from chatapp.generation import lifecycle  # noqa: E402


def users(n: int, prefix: str, password: str | None = None) -> list[dict]:
    User = get_user_model()
    out = []
    for i in range(n):
        user = User(username=f"{prefix}{i}")
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        conv = services.conversation_create(owner=user)
        out.append({"username": user.username, "user_id": user.pk,
                    "sessionid": session.session_key, "conversation_id": conv.pk})
    return out


def reply(conversation_id: int, content: str, status: str = "done") -> dict:
    from django.conf import settings

    from chatapp.prompts.services import PromptBuilder
    from inference.loader import load_tokenizer

    tokenizer = load_tokenizer(settings.LLM_MODEL, settings.LLM_MODEL_CACHE)
    builder = PromptBuilder(tokenizer, block_size=settings.LLM_BLOCK_SIZE)
    conv = Conversation.objects.get(pk=conversation_id)
    question = "Show me some HTML."
    user_msg, pending = services.message_send(
        conversation=conv, content=question,
        parent_id=getattr(selectors.latest_leaf(conversation=conv), "pk", None),
    )
    services.user_message_store_segment(message=user_msg, token_ids=builder.user_segment(question))
    generated = tokenizer.encode(content, add_special_tokens=False)
    done = lifecycle.reply_finish(
        reply=pending, status=status, content=content,
        generated_token_ids=generated,
        segment_token_ids=builder.assistant_segment(generated, False),
        prompt_tokens=len(generated), cached_tokens=0, ttft=0.01,
        finish_reason="stop" if status == Message.Status.DONE else status,
    )
    return {"user_message_id": user_msg.pk, "reply_id": done.pk}


def failed(conversation_id: int, error: str) -> dict:
    """A turn whose reply failed after it started (the engine refused or broke)."""
    conv = Conversation.objects.get(pk=conversation_id)
    user_msg, pending = services.message_send(
        conversation=conv, content="Tell me a story.",
        parent_id=getattr(selectors.latest_leaf(conversation=conv), "pk", None),
    )
    done = lifecycle.reply_finish(reply=pending, status=Message.Status.ERROR, error=error)
    return {"user_message_id": user_msg.pk, "reply_id": done.pk}


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "users":
        result = users(int(args[0]), args[1], args[2] if len(args) > 2 else None)
    elif command == "reply":
        result = reply(int(args[0]), args[1])
    elif command == "interrupted":
        result = reply(int(args[0]), args[1], Message.Status.INTERRUPTED)
    elif command == "failed":
        result = failed(int(args[0]), args[1])
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(result))
