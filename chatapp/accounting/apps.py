from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "chatapp.accounting"
    default_auto_field = "django.db.models.BigAutoField"
