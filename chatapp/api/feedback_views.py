"""/api/conversations/<id>/messages/<id>/feedback/: the user's thumbs up or down on a reply
of their conversation. Thin: chatapp.chat.feedback does the work."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chatapp.api.serializers import ErrorSerializer, StrictCharField
from chatapp.chat import feedback, selectors
from chatapp.chat.models import Feedback

E = ErrorSerializer


class FeedbackSerializer(serializers.Serializer):
    message_id = serializers.IntegerField(read_only=True)
    rating = serializers.ChoiceField(choices=list(feedback.RATINGS),
                                     error_messages={"invalid_choice": 'Use "up" or "down".'})
    comment = StrictCharField(required=False, allow_blank=True, default="", trim_whitespace=False,
                              max_length=Feedback.COMMENT_MAX_CHARS)
    updated_at = serializers.DateTimeField(read_only=True)


def _schema(operation_id: str, **kwargs):
    return extend_schema(operation_id=operation_id, tags=["feedback"], **kwargs)


class FeedbackView(APIView):
    def _conversation(self, request: Request, conversation_id: int):
        return selectors.conversation_get(user=request.user, conversation_id=conversation_id)

    @_schema("feedback_retrieve", responses={200: FeedbackSerializer, 401: E, 404: E, 429: E})
    def get(self, request: Request, conversation_id: int, message_id: int) -> Response:
        """Your feedback on a reply (404 when there is none)."""
        found = feedback.feedback_get(user=request.user, message_id=message_id,
                                      conversation=self._conversation(request, conversation_id))
        return Response(FeedbackSerializer(feedback.feedback_dict(found)).data)

    @_schema("feedback_set", request=FeedbackSerializer,
             responses={200: FeedbackSerializer, 400: E, 401: E, 404: E, 429: E})
    def put(self, request: Request, conversation_id: int, message_id: int) -> Response:
        """Rate a reply up or down, with an optional comment; one per reply, changed by
        sending it again."""
        conversation = self._conversation(request, conversation_id)
        body = FeedbackSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        saved = feedback.feedback_set(user=request.user, conversation=conversation,
                                      message_id=message_id, **body.validated_data)
        return Response(FeedbackSerializer(feedback.feedback_dict(saved)).data)

    @_schema("feedback_clear", responses={204: None, 401: E, 404: E, 429: E})
    def delete(self, request: Request, conversation_id: int, message_id: int) -> Response:
        """Take your feedback on a reply back."""
        feedback.feedback_clear(user=request.user, message_id=message_id,
                                conversation=self._conversation(request, conversation_id))
        return Response(status=status.HTTP_204_NO_CONTENT)
