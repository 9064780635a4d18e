from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chatapp.chat"
    label = "chat"
    verbose_name = "Chat"
