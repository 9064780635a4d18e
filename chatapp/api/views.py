"""/api/: conversations over REST (DRF). Thin: chat services/selectors do the work.

Every lookup goes through chatapp.chat.selectors, which scope to request.user: another
user's conversation answers 404, exactly like one that does not exist.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    permission_classes,
    throttle_classes,
)
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatapp.accounting.ratelimit import active_limiter
from chatapp.api import conversations
from chatapp.api.models import ApiKey
from chatapp.api.pagination import Pagination
from chatapp.api.serializers import (
    ConversationCreateSerializer,
    ConversationFilterSerializer,
    ConversationRenameSerializer,
    ConversationSerializer,
    ErrorSerializer,
    ExportSerializer,
    MessageContinueSerializer,
    MessageCreateSerializer,
    MessageSerializer,
    MessageTreeSerializer,
    PresetSerializer,
    StreamEventSerializer,
    TurnSerializer,
)
from chatapp.chat import chat_settings
from chatapp.chat import selectors as chat_selectors
from chatapp.chat import services as chat_services
from chatapp.chat.models import Message
from chatapp.generation import orphans, prompting, replies
from chatapp.prompts import catalog

E = ErrorSerializer
ERRORS = {401: E, 404: E, 429: E}
TAG = ["conversations"]


def _schema(operation_id: str, **kwargs):
    """extend_schema for a conversations endpoint."""
    return extend_schema(operation_id=operation_id, tags=TAG, **kwargs)


def _conversation(request: Request, conversation_id):
    return chat_selectors.conversation_get(user=request.user, conversation_id=conversation_id)


class PresetListView(APIView):
    @extend_schema(operation_id="presets_list", tags=["presets"],
                   responses={200: PresetSerializer(many=True), 401: E, 429: E})
    def get(self, request: Request) -> Response:
        """The system-prompt presets a conversation can start with."""
        data = [p.__dict__ for p in catalog.available_presets()]
        return Response(PresetSerializer(data, many=True).data)


class ConversationListView(GenericAPIView):
    pagination_class = Pagination

    @_schema("conversations_list", parameters=[ConversationFilterSerializer],
             responses={200: ConversationSerializer(many=True), 400: E, **ERRORS})
    def get(self, request: Request) -> Response:
        """Your conversations, newest first by default; paginated (`page`, `page_size`)."""
        filters = ConversationFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        qs = conversations.conversation_queryset(user=request.user, **filters.validated_data)
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(ConversationSerializer(page, many=True).data)

    @_schema("conversations_create", request=ConversationCreateSerializer,
             responses={201: ConversationSerializer, 400: E, 401: E, 429: E,
                        404: OpenApiResponse(E, description="`user_preset_id` names no "
                                             "personal preset of yours.")})
    def post(self, request: Request) -> Response:
        """Start a conversation (optionally with a preset, a version of it and its variables)."""
        body = ConversationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        changes = {name: data.pop(name) for name in chat_settings.SETTING_NAMES
                   if name in data and name != "model"}
        conversation = chat_settings.conversation_start(
            owner=request.user, user_preset_id=data.pop("user_preset_id"), changes=changes,
            **data)
        return Response(ConversationSerializer(conversation).data, status=status.HTTP_201_CREATED)


class ConversationDetailView(APIView):
    @_schema("conversations_retrieve", responses={200: ConversationSerializer, **ERRORS})
    def get(self, request: Request, conversation_id: int) -> Response:
        return Response(ConversationSerializer(_conversation(request, conversation_id)).data)

    @_schema("conversations_rename", request=ConversationRenameSerializer,
             responses={200: ConversationSerializer, 400: E, **ERRORS})
    def patch(self, request: Request, conversation_id: int) -> Response:
        """Rename, pin, archive (or restore) or tag a conversation."""
        conversation = _conversation(request, conversation_id)
        body = ConversationRenameSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changes = dict(body.validated_data)
        if "title" in changes:
            conversation = chat_services.conversation_rename(
                conversation=conversation, title=changes.pop("title"))
        conversation = chat_services.conversation_organise(conversation=conversation, **changes)
        return Response(ConversationSerializer(conversation).data)

    @_schema("conversations_destroy", responses={204: None, **ERRORS})
    def delete(self, request: Request, conversation_id: int) -> Response:
        """Delete a conversation and all its messages."""
        replies.delete_conversation(conversation=_conversation(request, conversation_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class MessageListView(APIView):
    @_schema("messages_tree", responses={200: MessageTreeSerializer, **ERRORS})
    def get(self, request: Request, conversation_id: int) -> Response:
        """Every message of the conversation as a tree in flat form: each message names its
        parent and children; edits and regenerations are siblings."""
        conversation = _conversation(request, conversation_id)
        tree = conversations.message_tree(conversation=conversation)
        return Response(MessageTreeSerializer(tree, context={"children": tree["children"]}).data)

    @_schema(
        "messages_create",
        request=MessageCreateSerializer,
        responses={
            201: TurnSerializer,
            (200, "text/event-stream"): OpenApiResponse(
                StreamEventSerializer,
                description="With `stream: true`: events message.created, message.started, "
                "message.delta (numbered text batches) and message.done (the final message).",
            ),
            400: OpenApiResponse(E, description="Invalid input; code "
                                 "`context_length_exceeded`: the message alone leaves no room "
                                 "for a reply in the model's context (nothing is stored)."),
            409: OpenApiResponse(E, description="A reply is still being generated."),
            503: OpenApiResponse(
                E, description="The reply could not be queued for a worker (the turn is "
                "kept, its reply marked failed)."
            ),
            **ERRORS,
        },
    )
    def post(self, request: Request, conversation_id: int) -> HttpResponse:
        """Send a message and get the reply: as JSON when it is complete, or streamed."""
        conversation = _conversation(request, conversation_id)
        body = MessageCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        def send():
            # Refused before anything is stored: a 400 naming the numbers.
            prompting.check_new_message(conversation=conversation,
                                        content=body.validated_data["content"])
            user_msg, reply = chat_services.message_send(
                conversation=conversation,
                content=body.validated_data["content"],
                parent_id=body.validated_data["parent_id"],
            )
            return (user_msg, reply), {
                "type": "message.created",
                "user_message": MessageSerializer(user_msg).data,
                "reply": MessageSerializer(reply).data,
            }

        (user_msg, reply), response = _run_turn(request, conversation, send,
                                                stream=body.validated_data["stream"])
        if response is not None:
            return response
        user_msg.refresh_from_db()
        reply.refresh_from_db()
        data = {"user_message": user_msg, "reply": reply}
        return Response(TurnSerializer(data).data, status=status.HTTP_201_CREATED)


def _run_turn(request: Request, conversation, make, *, stream: bool):
    """Make a turn's messages with make() -> (messages, its first event), the reply last,
    and generate the reply under the key's slot. A dead process's reply is finished first,
    so it cannot hold the conversation busy. (messages, the SSE response or None once the
    reply has ended)."""
    orphans.recover(conversation=conversation)
    slot = _slot(request)
    try:
        messages, first = make()
        response, slot = _generate(conversation, messages[-1], first, slot, stream=stream)
    finally:
        if slot is not None:
            slot.release()
    return messages, response


def _slot(request: Request):
    """A generation slot for a key (browser sessions are not limited); RateLimited is a
    429 from the exception handler."""
    return active_limiter().acquire(request.auth) if isinstance(request.auth, ApiKey) else None


def _generate(conversation, reply: Message, first: dict, slot, *, stream: bool):
    """Start generating `reply` (replies.start: on a worker, or on this process; 503 if
    the broker is down, the turn kept). Streamed: (the SSE response, None: the stream
    releases the slot). Otherwise it waits for the end: (None, slot)."""
    # Runs on the server's event loop; this request's thread waits for the result.
    started = async_to_sync(replies.start)(reply)
    if stream:
        events = conversations.reply_stream(
            started=started,
            group=conversation.group_name,
            first=first,
            on_close=slot.release if slot else (lambda: None),
        )
        response = StreamingHttpResponse(events, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response, None
    async_to_sync(started.wait)()
    return None, slot


class MessageDetailView(APIView):
    @_schema("messages_retrieve", responses={200: MessageSerializer, **ERRORS})
    def get(self, request: Request, conversation_id: int, message_id: int) -> Response:
        conversation = _conversation(request, conversation_id)
        message = chat_selectors.message_get(conversation=conversation, message_id=message_id)
        return Response(MessageSerializer(message).data)


class MessageStopView(APIView):
    @_schema("messages_stop", request=None, responses={202: MessageSerializer, **ERRORS})
    def post(self, request: Request, conversation_id: int, message_id: int) -> Response:
        """Stop a reply being generated: the engine request is cancelled, the text so far
        is kept with status 'stopped'. Stopping a finished reply changes nothing; one whose
        process died is found finished as 'interrupted'."""
        conversation = _conversation(request, conversation_id)
        orphans.recover(conversation=conversation)
        reply = chat_selectors.message_get(
            conversation=conversation, message_id=message_id, role=Message.Role.ASSISTANT
        )
        if reply.is_active:
            replies.request_stop(reply.pk)
        return Response(MessageSerializer(reply).data, status=status.HTTP_202_ACCEPTED)


class MessageContinueView(APIView):
    @_schema(
        "messages_continue",
        request=MessageContinueSerializer,
        responses={
            200: MessageSerializer,
            (200, "text/event-stream"): OpenApiResponse(
                StreamEventSerializer, description="With `stream: true`: as for a new message; "
                "message.started carries the text the reply holds already."),
            400: OpenApiResponse(E, description="Not a reply cut short (interrupted, "
                                 "stopped, or at its length limit), or not the last of its "
                                 "branch."),
            409: OpenApiResponse(E, description="A reply is still being generated."),
            **ERRORS,
        },
    )
    def post(self, request: Request, conversation_id: int, message_id: int) -> HttpResponse:
        """Generate more of a reply that was cut short, after the text it holds (the prompt
        is its previous one plus the reply's ids, so the prefix cache serves it)."""
        conversation = _conversation(request, conversation_id)
        body = MessageContinueSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        def resume():
            reply = chat_services.message_continue(conversation=conversation,
                                                   message_id=message_id)
            return (reply,), {"type": "message.created", "reply": MessageSerializer(reply).data}

        (reply,), response = _run_turn(request, conversation, resume,
                                       stream=body.validated_data["stream"])
        if response is not None:
            return response
        reply.refresh_from_db()
        return Response(MessageSerializer(reply).data)


class ExportView(APIView):
    @_schema("conversations_export", responses={200: ExportSerializer, **ERRORS})
    def get(self, request: Request, conversation_id: int) -> Response:
        """The whole conversation: every message (all branches) with its token counts and
        usage, the current branch, and usage totals."""
        data = conversations.export_data(conversation=_conversation(request, conversation_id))
        return Response(ExportSerializer(data, context={"children": data["children"]}).data)


class ExportMarkdownView(APIView):
    @_schema("conversations_export_markdown",
             responses={(200, "text/markdown"): OpenApiTypes.STR, **ERRORS})
    def get(self, request: Request, conversation_id: int) -> HttpResponse:
        """The current branch as Markdown, for people."""
        conversation = _conversation(request, conversation_id)
        text = conversations.export_markdown(conversation=conversation)
        response = HttpResponse(text, content_type="text/markdown; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="conversation-{conversation.pk}.md"'
        return response


@extend_schema(exclude=True)
@api_view(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
@authentication_classes([])
@permission_classes([])
@throttle_classes([])
def not_found(request: Request) -> Response:
    return Response({"detail": "Not found.", "code": "not_found"}, status=404)
