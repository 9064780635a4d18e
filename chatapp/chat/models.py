"""Conversations and their messages.

Messages form a tree through `parent`: an edit or a regeneration adds a sibling
beside the message it replaces, so nothing already said is ever rewritten.
Each message keeps the exact token ids it contributes to later prompts, so the
next turn's prompt extends this one token for token (see chatapp/prompts).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    # The title rule's one owner is chatapp.chat.services.validate_title; this is its limit.
    TITLE_MAX_CHARS = 200
    title = models.CharField(max_length=TITLE_MAX_CHARS, blank=True, default="")
    preset_id = models.CharField(max_length=100)
    # A preset that changes becomes a new version; the conversation keeps the one
    # it started with so its system segment (and its cached blocks) never change.
    preset_version = models.CharField(max_length=50, blank=True, default="")
    preset_variables = models.JSONField(default=dict, blank=True)
    # The model that answers it (an alias of LLM_MODELS), fixed at creation: its history
    # is that model's tokens. Blank: the default model (conversations from before).
    model = models.CharField(max_length=64, blank=True, default="")
    # The owner's organisation: pinned ones head the list; archived ones leave it but stay
    # searchable and can be restored. Changing either leaves updated_at (the order) alone.
    pinned = models.BooleanField(default=False)
    archived = models.BooleanField(default=False)
    # The owner's settings for it (the settings panel; chatapp.chat.chat_settings). A
    # system prompt of its own replaces the preset's text; blank: the preset's. Sampling
    # fields left null use the server's CHAT_TEMPERATURE, CHAT_TOP_P, CHAT_MAX_NEW_TOKENS.
    system_prompt = models.TextField(blank=True, default="")
    temperature = models.FloatField(null=True, blank=True)
    top_p = models.FloatField(null=True, blank=True)
    max_new_tokens = models.PositiveIntegerField(null=True, blank=True)
    # The personal preset it was started on or last given (the header names it).
    user_preset = models.ForeignKey(
        "UserPreset", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The message the owner last added or looked at: where a plain "send" continues.
    current_leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @property
    def group_name(self) -> str:
        """The channel-layer group every socket watching this conversation joins."""
        return f"chat.conversation.{self.pk}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        PENDING = "pending"
        STREAMING = "streaming"
        DONE = "done"
        STOPPED = "stopped"
        # Its process died mid-reply: the text persisted until then is kept (see
        # chatapp.generation.orphans); Continue resumes it.
        INTERRUPTED = "interrupted"
        ERROR = "error"

    # A reply in one of these is still being generated.
    ACTIVE = (Status.PENDING, Status.STREAMING)

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DONE)
    # The ids this message contributes to every later prompt (its whole segment,
    # role markers included); empty until the message is final.
    token_ids = models.JSONField(default=list, blank=True)
    # For a reply: exactly the ids the engine generated.
    generated_token_ids = models.JSONField(default=list, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft = models.FloatField(null=True, blank=True, help_text="seconds to the first token")
    # For a reply: where its prompt's prefix-cache match ended and why (reason, tokens
    # matched and restored from the host/disk tier, where a diverging prompt differs).
    prefix_cache = models.JSONField(null=True, blank=True)
    # The conversation's model when this message was made: whose tokenizer its ids are.
    # After a model change, older messages are encoded again from their text.
    model = models.CharField(max_length=64, blank=True, default="")
    finish_reason = models.CharField(max_length=16, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # For a reply: the engine that generated it (a worker's hostname, or web@host). The
    # router sends the conversation's next turn there, where its blocks are cached.
    served_by = models.CharField(max_length=200, blank=True, default="")
    # The claim of the generation now writing this reply; a generation whose claim was
    # taken over (its worker looked dead) may no longer write it.
    lease = models.CharField(max_length=32, blank=True, default="")
    # The process generating this reply ("host:pid:token", see chatapp.generation.orphans):
    # a reply whose process is gone is finished as interrupted.
    runner = models.CharField(max_length=200, blank=True, default="")
    # Stop asked for by a process that does not run the generation (it runs in a worker).
    stop_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["conversation", "parent"]),
            # Only the few replies being generated: what the orphan sweep reads.
            models.Index(fields=["status"], name="message_active_idx",
                         condition=models.Q(status__in=["pending", "streaming"])),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.pk} ({self.status})"

    REQUEST_ID_PREFIX = "msg-"

    @classmethod
    def request_id_for(cls, pk: int) -> str:
        """The engine request id of reply `pk`; stop aborts it by this name."""
        return f"{cls.REQUEST_ID_PREFIX}{pk}"

    @classmethod
    def pk_from_request_id(cls, request_id: str) -> int | None:
        """The reply an engine request id names; None for a request no reply made."""
        digits = (request_id or "").removeprefix(cls.REQUEST_ID_PREFIX)
        if digits == request_id or not digits.isdigit():
            return None
        return int(digits)

    @property
    def request_id(self) -> str:
        """The engine request id of this reply; stop aborts it by this name."""
        return self.request_id_for(self.pk)

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def can_continue(self) -> bool:
        """A reply cut short (interrupted, stopped, or at its token limit) that ends its
        branch: Continue generates more of it."""
        cut = self.status in (self.Status.INTERRUPTED, self.Status.STOPPED) or (
            self.status == self.Status.DONE and self.finish_reason == "length")
        return self.role == self.Role.ASSISTANT and cut and bool(self.token_ids)


class HistorySummary(models.Model):
    """The model's summary of the turns a history cut leaves out (CHAT_HISTORY_SUMMARY):
    asked for once per cut, generated once, then never changed. A cut is known by the
    last message it leaves out, whose path from the root is exactly those turns; every
    later prompt of that cut, on every branch below it, shows the stored segment after
    the marker, token for token."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        READY = "ready"
        FAILED = "failed"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="history_summaries"
    )
    last_left_out = models.OneToOneField(
        Message, on_delete=models.CASCADE, related_name="history_summary"
    )
    messages = models.PositiveIntegerField(help_text="messages the cut leaves out")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    text = models.TextField(blank=True, default="")
    # The segment that follows the marker: the summary marker template around the text,
    # padded to whole KV blocks. Prompts use these ids as stored.
    token_ids = models.JSONField(default=list, blank=True)
    # The request that made it: its prompt (mostly the cached prefix of the turns it
    # summarises) and how much of that the prefix cache served.
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"summary of {self.messages} messages before #{self.last_left_out_id} ({self.status})"

    REQUEST_ID_PREFIX = "summary-"

    @property
    def request_id(self) -> str:
        """The engine request id of its generation."""
        return f"{self.REQUEST_ID_PREFIX}{self.pk}"


class ConversationTag(models.Model):
    """A label the owner puts on a conversation; the sidebar filters by it. A row per tag
    (not a JSON list) so the filter is one indexed join on every database."""

    NAME_MAX_CHARS = 32
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=NAME_MAX_CHARS)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["conversation", "name"],
                                               name="conversation_tag_unique")]

    def __str__(self) -> str:
        return self.name


class Feedback(models.Model):
    """A user's thumbs up or down on a reply, with an optional comment: one per user per
    reply, changed in place. Operators read it per model and preset (the dashboard)."""

    COMMENT_MAX_CHARS = 2000

    class Rating(models.IntegerChoices):
        DOWN = -1
        UP = 1

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="feedback")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="chat_feedback")
    rating = models.SmallIntegerField(choices=Rating.choices)
    comment = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["message", "user"],
                                               name="feedback_one_per_user")]

    def __str__(self) -> str:
        return f"{self.get_rating_display()} on #{self.message_id}"


class ConversationShare(models.Model):
    """A read-only link to one branch of a conversation, as it was when shared: the
    messages are copied (a snapshot), so later turns, edits and other branches never show.
    The token is the link's only key (secrets.token_urlsafe); revoking ends it."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE,
                                     related_name="shares")
    token = models.CharField(max_length=64, unique=True)
    title = models.CharField(max_length=Conversation.TITLE_MAX_CHARS, blank=True, default="")
    # [{"role", "content", "created_at"}], root first: the branch at the time of sharing.
    messages = models.JSONField(default=list)
    leaf = models.ForeignKey(Message, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    # The owner's user name is shown only when they chose so.
    show_owner = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"share of conversation {self.conversation_id}"


class UserPreset(models.Model):
    """A user's own preset: a system prompt and reply settings saved from the settings
    panel, for new chats. Only its owner sees it; operators' presets are files
    (chatapp.prompts.presets)."""

    NAME_MAX_CHARS = 80
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_presets"
    )
    name = models.CharField(max_length=NAME_MAX_CHARS)
    system_prompt = models.TextField(blank=True, default="")
    temperature = models.FloatField(null=True, blank=True)
    top_p = models.FloatField(null=True, blank=True)
    max_new_tokens = models.PositiveIntegerField(null=True, blank=True)
    model = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="user_preset_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class GeneratedTitle(models.Model):
    """The title the model writes for a conversation after its first reply (CHAT_TITLES):
    asked for once, generated once, as a continuation of the conversation's own cached
    prompt. It replaces the title the conversation had when it was asked for (`replaces`,
    named after the first message) unless the user renamed it meanwhile: then it is
    dropped, since a user's rename always wins."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        READY = "ready"
        DROPPED = "dropped"  # the user renamed the conversation first
        FAILED = "failed"

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, related_name="generated_title"
    )
    # The first reply: its prompt and ids are the prefix the title's request extends.
    reply = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    replaces = models.CharField(max_length=Conversation.TITLE_MAX_CHARS, blank=True, default="")
    text = models.CharField(max_length=Conversation.TITLE_MAX_CHARS, blank=True, default="")
    # What it cost: its prompt (mostly the cached conversation), how much of that the
    # prefix cache served, and the tokens it wrote.
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    REQUEST_ID_PREFIX = "title-"

    def __str__(self) -> str:
        return f"title of conversation {self.conversation_id} ({self.status})"

    @property
    def request_id(self) -> str:
        return f"{self.REQUEST_ID_PREFIX}{self.pk}"
