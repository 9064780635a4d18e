from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "chatapp.api"
    label = "api"
    verbose_name = "REST API"
