"""/admin/cache/...: staff-only pages inside the admin (admin_view redirects others to its login)."""

from django.contrib import admin
from django.urls import path

from chatapp.dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", admin.site.admin_view(views.dashboard), name="cache"),
    path("data/", admin.site.admin_view(views.dashboard_data), name="cache-data"),
    path("reset/<str:engine_id>/", admin.site.admin_view(views.reset_cache), name="cache-reset"),
]
