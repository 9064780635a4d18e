"""/api/: a conversation's settings and the user's personal presets. Thin: the rules are
chatapp.chat.chat_settings'. Another user's conversation or preset answers 404, exactly
like one that does not exist."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatapp.api.chat_settings_serializers import (
    ConversationSettingsInputSerializer,
    ConversationSettingsSerializer,
    UserPresetInputSerializer,
    UserPresetSerializer,
)
from chatapp.api.serializers import ErrorSerializer
from chatapp.chat import chat_settings
from chatapp.chat import selectors as chat_selectors

E = ErrorSerializer
ERRORS = {401: E, 404: E, 429: E}


def _conversation(request: Request, conversation_id):
    return chat_selectors.conversation_get(user=request.user, conversation_id=conversation_id)


def _preset(request: Request, preset_id):
    return chat_settings.user_preset_get(user=request.user, preset_id=preset_id)


class ConversationSettingsView(APIView):
    @extend_schema(operation_id="conversations_settings_retrieve", tags=["conversations"],
                   responses={200: ConversationSettingsSerializer, **ERRORS})
    def get(self, request: Request, conversation_id: int) -> Response:
        """The conversation's system prompt, sampling settings, reply length and model."""
        return Response(ConversationSettingsSerializer(_conversation(request, conversation_id)).data)

    @extend_schema(operation_id="conversations_settings_update", tags=["conversations"],
                   request=ConversationSettingsInputSerializer,
                   responses={200: ConversationSettingsSerializer, 400: E, **ERRORS})
    def patch(self, request: Request, conversation_id: int) -> Response:
        """Change some settings (or apply a personal preset); they apply from the next
        turn, whose receipt says the cache was cold because of the change."""
        conversation = _conversation(request, conversation_id)
        body = ConversationSettingsInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changes = dict(body.validated_data)
        preset_id = changes.pop("user_preset_id", None)
        preset = _preset(request, preset_id) if preset_id is not None else None
        conversation = chat_settings.conversation_update_settings(
            conversation=conversation, changes=changes, user_preset=preset)
        return Response(ConversationSettingsSerializer(conversation).data)


class UserPresetListView(APIView):
    @extend_schema(operation_id="user_presets_list", tags=["presets"],
                   responses={200: UserPresetSerializer(many=True), 401: E, 429: E})
    def get(self, request: Request) -> Response:
        """Your personal presets, by name."""
        presets = chat_settings.user_preset_list(user=request.user)
        return Response(UserPresetSerializer(presets, many=True).data)

    @extend_schema(operation_id="user_presets_create", tags=["presets"],
                   request=UserPresetInputSerializer,
                   responses={201: UserPresetSerializer, 400: E, 401: E, 429: E})
    def post(self, request: Request) -> Response:
        """Save a system prompt and reply settings as a personal preset (400
        `presets_locked` where the server allows only its own presets)."""
        body = UserPresetInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values = dict(body.validated_data)
        name = values.pop("name", None)
        preset = chat_settings.user_preset_create(owner=request.user, name=name, values=values)
        return Response(UserPresetSerializer(preset).data, status=status.HTTP_201_CREATED)


class UserPresetDetailView(APIView):
    @extend_schema(operation_id="user_presets_retrieve", tags=["presets"],
                   responses={200: UserPresetSerializer, **ERRORS})
    def get(self, request: Request, preset_id: int) -> Response:
        return Response(UserPresetSerializer(_preset(request, preset_id)).data)

    @extend_schema(operation_id="user_presets_update", tags=["presets"],
                   request=UserPresetInputSerializer,
                   responses={200: UserPresetSerializer, 400: E, **ERRORS})
    def patch(self, request: Request, preset_id: int) -> Response:
        """Change a preset; chats already on it keep the settings they copied."""
        preset = _preset(request, preset_id)
        body = UserPresetInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values = dict(body.validated_data)
        name = values.pop("name", None)
        preset = chat_settings.user_preset_update(preset=preset, name=name, values=values)
        return Response(UserPresetSerializer(preset).data)

    @extend_schema(operation_id="user_presets_destroy", tags=["presets"],
                   responses={204: None, **ERRORS})
    def delete(self, request: Request, preset_id: int) -> Response:
        """Delete a preset; chats started on it keep their settings."""
        chat_settings.user_preset_delete(preset=_preset(request, preset_id))
        return Response(status=status.HTTP_204_NO_CONTENT)
