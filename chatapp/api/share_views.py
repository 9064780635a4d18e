"""/api/conversations/<id>/shares/: read-only links to one branch of a conversation.
Thin: chatapp.chat.shares does the work."""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatapp.api.serializers import ErrorSerializer
from chatapp.chat import selectors, shares

E = ErrorSerializer
ERRORS = {401: E, 404: E, 429: E}


class ShareSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    url = serializers.SerializerMethodField(help_text="The link: anyone who has it can read "
                                            "the branch (CHAT_SHARE_REQUIRES_LOGIN: users).")
    message_count = serializers.SerializerMethodField()
    show_owner = serializers.BooleanField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)

    def get_url(self, obj) -> str:
        path = reverse("chat:shared", args=[obj.token])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path

    def get_message_count(self, obj) -> int:
        return len(obj.messages)


class ShareCreateSerializer(serializers.Serializer):
    message_id = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1,
        help_text="The last message of the branch to share (default: the current leaf).")
    show_owner = serializers.BooleanField(required=False, default=False,
                                          help_text="Show your user name on the shared page.")


def _conversation(request: Request, conversation_id: int):
    return selectors.conversation_get(user=request.user, conversation_id=conversation_id)


class ShareListView(APIView):
    @extend_schema(operation_id="shares_list", tags=["shares"],
                   responses={200: ShareSerializer(many=True), **ERRORS})
    def get(self, request: Request, conversation_id: int) -> Response:
        """The conversation's links that still work."""
        found = shares.share_list(conversation=_conversation(request, conversation_id))
        return Response(ShareSerializer(found, many=True, context={"request": request}).data)

    @extend_schema(operation_id="shares_create", tags=["shares"], request=ShareCreateSerializer,
                   responses={201: ShareSerializer, 400: E, **ERRORS})
    def post(self, request: Request, conversation_id: int) -> Response:
        """Share one branch read-only, as it is now (later messages are not shown)."""
        conversation = _conversation(request, conversation_id)
        body = ShareCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        share = shares.share_create(conversation=conversation, **body.validated_data)
        return Response(ShareSerializer(share, context={"request": request}).data,
                        status=status.HTTP_201_CREATED)


class ShareDetailView(APIView):
    @extend_schema(operation_id="shares_revoke", tags=["shares"],
                   responses={204: None, **ERRORS})
    def delete(self, request: Request, conversation_id: int, share_id: int) -> Response:
        """Revoke a link: it answers 404 from now on."""
        shares.share_revoke(conversation=_conversation(request, conversation_id),
                            share_id=share_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
