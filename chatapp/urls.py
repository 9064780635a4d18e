from django.contrib import admin
from django.urls import include, path

from chatapp.web import views as web_views

urlpatterns = [
    # Before admin/ so the admin does not take /admin/cache/ for an app label.
    path("admin/cache/", include("chatapp.dashboard.admin_urls")),
    path("admin/", admin.site.urls),
    path("accounts/signup/", web_views.signup, name="signup"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("v1/", include("chatapp.api.v1.urls")),
    path("", include("chatapp.api.urls")),
    path("", include("chatapp.dashboard.urls")),
    path("", include("chatapp.accounting.urls")),
    path("", include("chatapp.web.urls")),
]
