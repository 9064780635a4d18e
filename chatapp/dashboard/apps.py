from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "chatapp.dashboard"
    label = "dashboard"
    verbose_name = "Cache dashboard"
