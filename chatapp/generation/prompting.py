"""The chat service's one door to the prompt manager (chatapp.prompts).

Everything the chat needs from it passes here: presets for the picker, the
token-level prompt of a reply, the segment a finished reply stores, the tenant's
cache salt. While the prompt manager is not importable, a small ChatML fallback
stands in so the chat still works (and says so in the log).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

from django.conf import settings

log = logging.getLogger(__name__)


class PromptFailure(Exception):
    """The prompt cannot be built (context too long, unknown preset, ...): shown to the user."""


@dataclass(frozen=True)
class PresetRef:
    id: str
    version: str
    title: str
    description: str = ""


@dataclass
class ReplyPrompt:
    token_ids: list[int]
    user_segment: list[int]
    cache_salt: str
    stop_token_ids: list[int]
    max_new_tokens: int
    builder: object = None
    plan: object = None
    extra: dict = field(default_factory=dict)


def _prompt_manager():
    """The prompt manager's modules, or None while it has not landed."""
    try:
        from chatapp.prompts import presets, services
    except ImportError:
        return None
    if not hasattr(services, "PromptBuilder"):
        return None
    return presets, services


# -- presets -----------------------------------------------------------------

FALLBACK_PRESET = PresetRef(
    id="assistant", version="1", title="General assistant",
    description="A helpful, concise assistant.",
)
FALLBACK_SYSTEM_TEXT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _as_ref(preset) -> PresetRef:
    return PresetRef(
        id=str(getattr(preset, "id", getattr(preset, "preset_id", ""))),
        version=str(getattr(preset, "version", "")),
        title=str(getattr(preset, "title", "") or getattr(preset, "name", "") or preset),
        description=str(getattr(preset, "description", "") or ""),
    )


def available_presets() -> list[PresetRef]:
    pm = _prompt_manager()
    if pm is None:
        return [FALLBACK_PRESET]
    return [_as_ref(p) for p in pm[0].list_presets()]


def default_preset_id() -> str:
    presets = available_presets()
    wanted = getattr(settings, "CHAT_DEFAULT_PRESET", "")
    if wanted and any(p.id == wanted for p in presets):
        return wanted
    return presets[0].id


def resolve_preset(preset_id: str | None, version: str | None = None) -> PresetRef:
    """The preset (latest version unless one is named); PromptFailure if unknown."""
    preset_id = preset_id or default_preset_id()
    pm = _prompt_manager()
    if pm is None:
        if preset_id != FALLBACK_PRESET.id:
            raise PromptFailure(f"Unknown preset {preset_id!r}.")
        return FALLBACK_PRESET
    try:
        return _as_ref(pm[0].get_preset(preset_id, version or None))
    except Exception as exc:  # the prompt manager's own not-found error, whatever its class
        raise PromptFailure(f"Unknown preset {preset_id!r}.") from exc


# -- prompts -----------------------------------------------------------------


@functools.cache
def _builder(tokenizer):
    pm = _prompt_manager()
    if pm is None:
        log.warning("chatapp.prompts.services.PromptBuilder is missing; using the ChatML fallback")
        return _FallbackBuilder(tokenizer, settings.LLM_BLOCK_SIZE)
    return pm[1].PromptBuilder(tokenizer, block_size=settings.LLM_BLOCK_SIZE)


def _stop_ids(tokenizer) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return sorted(ids)


def build_reply_prompt(*, tokenizer, conversation, history: list, max_new_tokens: int) -> ReplyPrompt:
    """The prompt for a reply to history[-1] (a user message), from stored segments.

    `history` is the branch from the root to the user message; every earlier message
    contributes exactly its stored token ids, so this prompt extends the last one.
    """
    builder = _builder(tokenizer)
    user_msg = history[-1]
    earlier = [list(m.token_ids) for m in history[:-1]]
    if any(not seg for seg in earlier):
        raise PromptFailure("An earlier message of this branch has no stored tokens.")
    max_model_len = getattr(settings, "LLM_MAX_MODEL_LEN", None) or 8192
    pm = _prompt_manager()
    try:
        system_ids = builder.system_segment(
            conversation.preset_id,
            conversation.preset_version or None,
            conversation.preset_variables or None,
        )
        plan = builder.build(
            system_ids,
            earlier,
            user_msg.content,
            max_model_len=max_model_len,
            max_new_tokens=max_new_tokens,
        )
    except Exception as exc:
        if pm is not None and isinstance(exc, pm[1].PromptError):
            raise PromptFailure(str(exc)) from exc
        if isinstance(exc, PromptFailure):
            raise
        raise
    token_ids = list(plan.token_ids)
    room = max_model_len - len(token_ids)
    if room < 1:
        raise PromptFailure("This conversation is too long for the model's context.")
    if pm is not None:
        try:
            from chatapp.prompts.profile import record_prompt

            record_prompt(plan)
        except Exception:  # the profile is a diagnostic; a reply never fails for it
            log.debug("record_prompt failed", exc_info=True)
    return ReplyPrompt(
        token_ids=token_ids,
        user_segment=list(plan.new_user_segment),
        cache_salt=builder.cache_salt_for(conversation.owner),
        stop_token_ids=_stop_ids(tokenizer),
        max_new_tokens=min(max_new_tokens, room),
        builder=builder,
        plan=plan,
    )


def reply_segment(prompt: ReplyPrompt, generated: list[int], *, finished_with_eos: bool) -> list[int]:
    """The ids a finished (or stopped) reply stores for later prompts."""
    return list(prompt.builder.assistant_segment(list(generated), finished_with_eos))


# -- fallback ----------------------------------------------------------------


@dataclass
class _FallbackPlan:
    token_ids: list[int]
    new_user_segment: list[int]


class _FallbackBuilder:
    """ChatML at token level, system segment padded to whole blocks (SmolLM2/Qwen2 only)."""

    def __init__(self, tokenizer, block_size: int):
        self.tok = tokenizer
        self.block_size = block_size
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.newline = self._enc("\n")

    def _enc(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def system_segment(self, preset_id, version=None, variables=None) -> list[int]:
        body = self._enc("<|im_start|>system\n" + FALLBACK_SYSTEM_TEXT)
        tail = [self.im_end, *self.newline]
        pad = (-(len(body) + len(tail))) % self.block_size
        return body + self.newline[:1] * pad + tail

    def user_segment(self, text: str) -> list[int]:
        return self._enc("<|im_start|>user\n" + text) + [self.im_end, *self.newline]

    def generation_prompt(self) -> list[int]:
        return self._enc("<|im_start|>assistant\n")

    def assistant_segment(self, generated_ids, finished_with_eos) -> list[int]:
        ids = list(generated_ids)
        if ids and ids[-1] == self.im_end:
            ids.pop()
        return self.generation_prompt() + ids + [self.im_end, *self.newline]

    def build(self, system_ids, history_segments, new_user_text, max_model_len=None,
              max_new_tokens=0):
        user = self.user_segment(new_user_text)
        ids = list(system_ids)
        for seg in history_segments:
            ids += seg
        ids += user + self.generation_prompt()
        if max_model_len and len(ids) + 1 > max_model_len:
            raise PromptFailure("This conversation is too long for the model's context.")
        return _FallbackPlan(token_ids=ids, new_user_segment=user)

    def cache_salt_for(self, user) -> str:
        return f"user-{user.pk}"
