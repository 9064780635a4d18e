from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "chatapp.dashboard"
    label = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Cache dashboard"
