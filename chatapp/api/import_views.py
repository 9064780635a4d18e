"""/api/conversations/import/: another chat service's export file as your conversations.
Thin: chatapp.chat.imports does the work."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import parsers, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatapp.api import json_body
from chatapp.api.serializers import ConversationSerializer, ErrorSerializer
from chatapp.chat import imports
from chatapp.chat.errors import InvalidInput
from chatapp.generation.served_models import conversation_model

E = ErrorSerializer


class ImportUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="ChatGPT's conversations.json or Open WebUI's "
                                 "JSON export (at most CHAT_IMPORT_MAX_BYTES).")


class ImportResultSerializer(serializers.Serializer):
    conversations = ConversationSerializer(many=True)


def _file_data(request: Request) -> object:
    upload = request.data.get("file")
    if upload is None or isinstance(upload, str):
        raise InvalidInput("Send the export file as the multipart field \"file\", or its "
                           "JSON as the request body.", code="import_refused")
    imports.check_upload_size(upload.size)
    try:
        return json_body.loads(upload.read(), max_bytes=settings.CHAT_IMPORT_MAX_BYTES)
    except json_body.JSONBodyError as exc:
        raise InvalidInput(f"The file could not be read: {exc.message}",
                           code="import_refused") from None


class ConversationImportView(APIView):
    parser_classes = [json_body.JSONParser, parsers.MultiPartParser]

    @extend_schema(
        operation_id="conversations_import", tags=["conversations"],
        request={"multipart/form-data": ImportUploadSerializer,
                 "application/json": OpenApiTypes.ANY},
        responses={201: ImportResultSerializer, 400: E, 401: E, 413: E, 429: E})
    def post(self, request: Request) -> Response:
        """Import ChatGPT's `conversations.json` or Open WebUI's JSON export, branches
        kept, as your conversations on the default model. A file that cannot be read is
        refused whole (400 naming the conversation and message) and nothing is stored."""
        if request.content_type.startswith("multipart/"):
            data = _file_data(request)
        else:
            data = request.data
        conversations = imports.parse_export(data)
        stored = imports.conversations_import(owner=request.user, conversations=conversations,
                                              model=conversation_model(None))
        return Response({"conversations": ConversationSerializer(stored, many=True).data},
                        status=status.HTTP_201_CREATED)
