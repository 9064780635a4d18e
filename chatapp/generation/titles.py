"""Titles the model writes (CHAT_TITLES; the prompt side: chatapp.prompts.titles).

Once a conversation's first reply has ended, `after_reply` asks for its title: the
conversation's own prompt through that reply plus a fixed request, so the prefix cache
serves all but the request and the title costs only its own tokens. It is background
work (chatapp.generation.background): on a Celery worker when dispatch says so, else on
this process's engine once that is idle. The row is claimed (pending -> running) before
any work and written once; the title replaces the one the conversation had when it was
asked for, unless the user renamed it meanwhile (then it is dropped). The page hears of
it as a `conversation.title` event on the conversation's group, after the reply's
`message.done`.
"""

from __future__ import annotations

import logging

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from chatapp.chat import selectors
from chatapp.chat.models import Conversation, GeneratedTitle, Message
from chatapp.chat.services import auto_title
from chatapp.generation import background, dispatch, prompting
from chatapp.generation.embedded import aget_engine
from chatapp.generation.events import publish
from chatapp.generation.jobs import Job, Options
from chatapp.prompts.services import cache_salt_for
from chatapp.prompts.titles import MAX_TOKENS, request_text, title_from, titles_enabled

log = logging.getLogger(__name__)

Status = GeneratedTitle.Status
# A reply with text to title: one that ended on its own or was stopped by its user.
TITLED_REPLIES = (Message.Status.DONE, Message.Status.STOPPED)


class TitleFailed(Exception):
    """A title that cannot be made; the conversation keeps the one it has."""


async def after_reply(reply_id: int, *, detached: bool = True) -> None:
    """Ask for the title of reply `reply_id`'s conversation when that is its first reply,
    and start it. Never raises: a title is not worth a reply's error."""
    try:
        title_id = await database_sync_to_async(ask)(reply_id)
        if title_id is not None:
            await start(title_id, detached=detached)
    except Exception:
        log.warning("Starting the title after reply %s failed", reply_id, exc_info=True)


def ask(reply_id: int) -> int | None:
    """The id of the title row this reply creates (pending), for `start`; None when titles
    are off, the reply is not the conversation's first (or has no text), the conversation
    already has a title row, or its user has named it."""
    if not titles_enabled():
        return None
    reply = Message.objects.select_related("conversation", "parent").get(pk=reply_id)
    first = reply.parent
    if (reply.role != Message.Role.ASSISTANT or reply.status not in TITLED_REPLIES
            or not reply.token_ids or first is None or first.parent_id is not None):
        return None
    conversation = reply.conversation
    if conversation.title not in ("", auto_title(first.content)):
        return None  # named by its user (or its creator): theirs stands
    row, created = GeneratedTitle.objects.get_or_create(
        conversation=conversation, defaults={"reply": reply, "replaces": conversation.title})
    return row.pk if created else None


async def start(title_id: int, *, detached: bool = True) -> None:
    """Generate title `title_id`: on a worker when dispatch says so, else here once the
    engine is idle, in a task of its own (`detached`) or before returning."""
    queued, model = await database_sync_to_async(_enqueue)(title_id)
    if not queued:
        await background.run_when_idle(lambda: generate(title_id), model=model,
                                       detached=detached)


def _enqueue(title_id: int) -> tuple[bool, str]:
    row = GeneratedTitle.objects.select_related("conversation", "reply").get(pk=title_id)
    model = row.conversation.model
    return dispatch.enqueue_title(title_id=title_id, max_tokens=MAX_TOKENS,
                                  preferred=row.reply.served_by, model=model), model


async def generate(title_id: int) -> str:
    """Generate the pending title `title_id` on this process's engine, store it, and tell
    the conversation's page; its status after (a title claimed or finished elsewhere is
    left as it is)."""
    if not await database_sync_to_async(_claim)(title_id):
        return await database_sync_to_async(_status)(title_id)
    usage: dict = {}
    try:
        model = await database_sync_to_async(_model_of)(title_id)
        engine = await aget_engine(model)
        job = await database_sync_to_async(_job)(title_id, engine.tokenizer)
        generation = await background.generate_here(job)
        choice = generation.choices[0]
        usage = {"prompt_tokens": generation.prompt_tokens,
                 "cached_tokens": generation.cached_tokens,
                 "completion_tokens": len(choice.token_ids)}
        if choice.engine_reason not in ("stop", "length"):
            raise TitleFailed(choice.error or f"the generation ended: {choice.engine_reason}")
        title = title_from(choice.text, Conversation.TITLE_MAX_CHARS)
        if not title:
            raise TitleFailed("the model wrote no title")
        status, conversation_id = await database_sync_to_async(_store)(title_id, title, usage)
    except GeneratedTitle.DoesNotExist:
        return "gone"  # deleted with its conversation
    except Exception as exc:  # whatever it is, the conversation keeps its title
        log.warning("Title %s failed", title_id, exc_info=True)
        error = str(exc) if isinstance(exc, TitleFailed | prompting.PromptFailure) else (
            f"{type(exc).__name__}: {exc}")
        await database_sync_to_async(_fail)(title_id, error, usage)
        return Status.FAILED
    if status == Status.READY:
        group = Conversation(pk=conversation_id).group_name
        await publish(group, {"type": "conversation.title", "conversation_id": conversation_id,
                              "title": title})
    return status


def _claim(title_id: int) -> bool:
    return GeneratedTitle.objects.filter(pk=title_id, status=Status.PENDING).update(
        status=Status.RUNNING, updated_at=timezone.now()) == 1


def _status(title_id: int) -> str:
    return GeneratedTitle.objects.filter(pk=title_id).values_list(
        "status", flat=True).first() or "gone"


def _model_of(title_id: int) -> str:
    return GeneratedTitle.objects.values_list("conversation__model", flat=True).get(
        pk=title_id)


def _job(title_id: int, tokenizer) -> Job:
    """The request: the conversation's prompt through its first reply, then the title's."""
    row = GeneratedTitle.objects.select_related("conversation", "reply").get(pk=title_id)
    conversation = row.conversation
    plan = prompting.build_request_prompt(
        tokenizer=tokenizer, conversation=conversation,
        history=selectors.message_path(message=row.reply), request=request_text(),
        what="The title's")
    # Greedy: one title, stored for good, is the model's most likely one.
    options = Options(default_max_tokens=MAX_TOKENS, temperature=0.0)
    return Job(prompt_ids=plan.token_ids, cache_salt=cache_salt_for(conversation.owner),
               options=options, request_id=row.request_id, model=conversation.model)


@transaction.atomic
def _store(title_id: int, title: str, usage: dict) -> tuple[str, int]:
    """The one write after the claim, and the conversation's new title unless its user
    renamed it meanwhile: (status after, the conversation's id)."""
    row = GeneratedTitle.objects.select_for_update().get(pk=title_id)
    if row.status != Status.RUNNING:
        return row.status, row.conversation_id  # dropped by a rename since the claim
    # The title it replaces must still be there: a rename in between keeps the user's.
    # updated_at is left alone, so the conversation keeps its place in the list.
    renamed = not Conversation.objects.filter(
        pk=row.conversation_id, title=row.replaces).update(title=title)
    status = Status.DROPPED if renamed else Status.READY
    GeneratedTitle.objects.filter(pk=title_id, status=Status.RUNNING).update(
        status=status, text=title, updated_at=timezone.now(), **usage)
    return status, row.conversation_id


def _fail(title_id: int, error: str, usage: dict) -> None:
    GeneratedTitle.objects.filter(pk=title_id, status=Status.RUNNING).update(
        status=Status.FAILED, error=error, updated_at=timezone.now(), **usage)
