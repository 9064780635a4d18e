from django.urls import path, re_path

from chatapp.api.v1 import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="v1-chat-completions"),
    path("models", views.models, name="v1-models"),
    path("models/<path:model>", views.models, name="v1-model"),
    re_path(r"^(?P<rest>.*)$", views.not_found),
]
