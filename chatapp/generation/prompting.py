"""A chat reply's prompt, from the conversation's stored segments (chatapp.prompts).

History longer than the context is cut by the prompt manager (chatapp.prompts.history)
against the context of the engine that runs the reply, less CHAT_CONTEXT_TOKENS where
that is set; how many tokens the reply may take is still decided against that engine
(chatapp.generation.jobs and the engine's add_request). A message that alone leaves no
room for a reply is refused before it is stored (check_new_message). With summaries on
(CHAT_HISTORY_SUMMARY), every cut holds room after the marker for the summary of its
left-out turns, and shows the stored one once it is ready.
"""

from __future__ import annotations

import logging

from django.conf import settings

from chatapp.chat import selectors
from chatapp.chat import services as chat_services
from chatapp.chat.errors import InvalidInput, sentence
from chatapp.chat.models import Message
from chatapp.generation import embedded
from chatapp.generation.served_models import UnknownModel, alias_of
from chatapp.prompts.errors import ContextExceeded, PromptError
from chatapp.prompts.history import ContextLimit, history_target
from chatapp.prompts.profile import record_prompt
from chatapp.prompts.services import (
    PromptBuilder,
    PromptPlan,
    builder_for,
    cache_salt_for,
    default_block_size,
)
from chatapp.prompts.summaries import summary_room

log = logging.getLogger(__name__)


def context_tokens(model: str = "", *, chat: bool = True) -> int:
    """The context a prompt and its reply share on `model`: the loaded engine's (else the
    configured one, an upper bound until it loads), for a chat capped by
    CHAT_CONTEXT_TOKENS."""
    engine = embedded.loaded_engine(model)
    if engine is not None:
        tokens = int(engine.max_model_len)
    else:
        tokens = int(embedded.engine_config(model or None).max_model_len)
    cap = settings.CHAT_CONTEXT_TOKENS if chat else 0
    return min(tokens, cap) if cap else tokens


def context_limit(model: str = "", reply_tokens: int | None = None) -> ContextLimit:
    """What a chat prompt must fit: the context, the reply's budget (CHAT_MAX_NEW_TOKENS,
    at most half the context), CHAT_HISTORY_TARGET and the room a cut holds for a
    summary (CHAT_HISTORY_SUMMARY_TOKENS when summaries are on)."""
    tokens = context_tokens(model)
    if reply_tokens is None:
        reply_tokens = settings.CHAT_MAX_NEW_TOKENS
    return ContextLimit(tokens, min(int(reply_tokens), tokens // 2), history_target(),
                        summary_room(default_block_size()))


class PromptFailure(Exception):
    """The prompt cannot be built (unknown preset, a stored message without ids, ...)."""


def _system_ids(builder: PromptBuilder, conversation) -> list[int]:
    if conversation.system_prompt:
        # The chat's own text, as written, never rendered (chatapp.prompts.system_text):
        # padded to whole blocks like a preset's, so chats on the same text share them.
        return builder.system_segment_for_text(conversation.system_prompt)
    return builder.system_segment(conversation.preset_id, conversation.preset_version or None,
                                  conversation.preset_variables or None)


def _same_model(message, conversation) -> bool:
    return alias_of(message.model) == alias_of(conversation.model)


def _segments(builder: PromptBuilder, conversation, messages: list, has_system: bool,
              ) -> list[list[int]]:
    """The stored ids of `messages`, oldest first; a message another model made (the
    chat's model changed since) is encoded from its text by this tokenizer instead, the
    same way every turn, so later turns still extend the prompt. A message of this model
    that has no ids yet (an imported one) is encoded once and its ids are stored, so
    every later turn reuses them and hits the cache."""
    out = []
    for i, m in enumerate(messages):
        if _same_model(m, conversation) and m.token_ids:
            out.append(list(m.token_ids))
            continue
        if m.role == Message.Role.USER:
            first = i == 0
            ids = builder.user_segment(m.content, opening=first and not has_system,
                                       after_system=first and has_system)
        else:
            ids = builder.assistant_segment_from_text(m.content)
        if _same_model(m, conversation):
            chat_services.message_store_segment(message=m, token_ids=ids)
        out.append(ids)
    return out


def build_reply_prompt(*, tokenizer, conversation, history: list) -> PromptPlan:
    """The prompt for a reply to history[-1] (a user message), from stored segments.

    `history` is the branch from the root to the user message; every earlier message
    contributes exactly its stored token ids, so this prompt extends the last one.
    """
    try:
        plan = _build(builder_for(tokenizer), conversation, history)
    except PromptError as exc:
        raise PromptFailure(sentence(str(exc), "The prompt failed.")) from exc
    try:
        record_prompt(plan, label=f"chat c{conversation.pk} u{history[-1].pk}")
    except Exception:  # the profile is a diagnostic; a reply never fails for it
        log.debug("record_prompt failed", exc_info=True)
    return plan


def _build(builder: PromptBuilder, conversation, history: list, text: str | None = None,
           ) -> PromptPlan:
    """The plan for a reply to history[-1], its oldest turns left out where the history
    no longer fits the context (a turn begins at each user message), with the stored
    summary of a cut that has one. `text`: a new message after the whole of `history`
    instead (a summary's request)."""
    earlier, text = (history[:-1], history[-1].content) if text is None else (history, text)
    system = _system_ids(builder, conversation)
    own = bool(conversation.system_prompt)
    # Stored summaries are the tokens of the model that wrote them.
    one_model = all(_same_model(m, conversation) for m in earlier)
    return builder.build(
        system,
        _segments(builder, conversation, earlier, bool(system)),
        text,
        preset_id=None if own else conversation.preset_id,
        preset_version=None if own else conversation.preset_version or None,
        cache_salt=cache_salt_for(conversation.owner),
        limit=context_limit(conversation.model, conversation.max_new_tokens),
        turn_starts=[m.role == Message.Role.USER for m in earlier],
        # A cut is known by the last message it leaves out.
        summary=lambda left_out: (selectors.ready_summary_ids(message=earlier[left_out - 1])
                                  if one_model else None),
    )


def build_summary_prompt(*, tokenizer, conversation, left_out: list, request: str) -> PromptPlan:
    """The prompt that asks for a summary of `left_out` (root .. the last message a cut
    leaves out): the conversation's own prompt up to that message (cut as its turns were,
    with an earlier cut's summary, so mostly blocks the prefix cache still holds), then
    `request` as a user turn. PromptFailure when it cannot be built."""
    return build_request_prompt(tokenizer=tokenizer, conversation=conversation,
                                history=left_out, request=request, what="The summary's")


def build_request_prompt(*, tokenizer, conversation, history: list, request: str,
                         what: str) -> PromptPlan:
    """The conversation's own prompt through `history` (root .. a stored message), then
    `request` as a user turn: a request the service sends for itself (a summary, a
    title), served from the prefix cache but for the request. PromptFailure (`what`
    prompt failed) when it cannot be built."""
    try:
        return _build(builder_for(tokenizer), conversation, history, request)
    except PromptError as exc:
        raise PromptFailure(sentence(str(exc), f"{what} prompt failed.")) from exc


def check_new_message(*, conversation, content: object) -> None:
    """InvalidInput (code context_length_exceeded) when `content`, as the conversation's
    next message, would leave no room for a reply even with every earlier turn left out:
    refused before anything is stored, naming the numbers. Anything else wrong with the
    text is left to chatapp.chat.services, which says so in its own words."""
    if not isinstance(content, str) or not content.strip():
        return
    try:
        builder = builder_for(embedded.get_tokenizer(conversation.model))
        system = _system_ids(builder, conversation)
        has_history = Message.objects.filter(conversation=conversation).exists()
        user = builder.user_segment(content, opening=not system and not has_history,
                                    after_system=bool(system) and not has_history)
    except (PromptError, UnknownModel):
        return  # the reply says what is wrong, as it always has
    marker = builder.marker_segment(after_system=bool(system)) if has_history else []
    limit = context_limit(conversation.model, conversation.max_new_tokens)
    need = len(system) + len(marker) + len(user) + len(builder.generation_prompt())
    if need >= limit.max_model_len:
        raise InvalidInput(sentence(str(ContextExceeded(need, limit.max_model_len))),
                           code="context_length_exceeded")


def conversation_prompt_ids(*, tokenizer, conversation) -> list[int]:
    """The ids the conversation's next turn starts with: its system segment, the marker
    and kept turns where its history was cut, then the stored segments of its current
    branch up to the first message without ids."""
    builder = builder_for(tokenizer)
    try:
        ids = _system_ids(builder, conversation)
    except PromptError:
        return []
    branch = []
    for message in selectors.current_branch(conversation=conversation):
        if not message.token_ids or not _same_model(message, conversation):
            break
        branch.append(message)
    # The last turn's prompt says which turns the next one starts from.
    last_user = max((i for i, m in enumerate(branch) if m.role == Message.Role.USER), default=None)
    if last_user is not None:
        try:
            plan = _build(builder, conversation, branch[: last_user + 1])
        except PromptError:
            plan = None
        if plan is not None and plan.cut is not None:
            header = len(builder.generation_prompt())
            ids = list(plan.token_ids[:-header])
            branch = branch[last_user + 1:]
    for message in branch:
        ids.extend(message.token_ids)
    return ids
