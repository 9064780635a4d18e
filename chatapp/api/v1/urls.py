from django.urls import path, re_path

from chatapp.api.v1 import response_views, text_completion_views, views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="v1-chat-completions"),
    path("completions", text_completion_views.create, name="v1-completions"),
    path("models", views.models, name="v1-models"),
    path("models/<path:model>", views.models, name="v1-model"),
    path("responses", response_views.create, name="v1-responses"),
    path("responses/<str:response_id>", response_views.detail, name="v1-response"),
    re_path(r"^(?P<rest>.*)$", views.not_found),
]
