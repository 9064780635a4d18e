from django.apps import AppConfig


class PromptsConfig(AppConfig):
    name = "chatapp.prompts"
    label = "prompts"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Prompt manager"
