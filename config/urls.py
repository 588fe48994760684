from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from cluster.login import LoginView

urlpatterns = [
    path("", include("cluster.urls")),
    path("", include("scheduling.urls")),
    path("", include("monitoring.urls")),
    path("accounts/login/", LoginView.as_view(), name="login"),
    # one login page, with its lockout, for the admin too
    path("admin/login/", RedirectView.as_view(url="/accounts/login/", query_string=True), name="admin-login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("config.api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
]
