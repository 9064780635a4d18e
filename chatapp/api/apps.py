from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "chatapp.api"
    label = "api"
    verbose_name = "REST API"

    def ready(self) -> None:
        # Registers the OpenAPI description of the Bearer key scheme with drf-spectacular.
        from chatapp.api import schema  # noqa: F401
