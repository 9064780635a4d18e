"""Root-level endpoints: /metrics, /healthz, /readyz (the admin pages are in admin_urls)."""

from django.urls import path

from chatapp.dashboard import views

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
]
