from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from cluster import views as cluster_views
from monitoring import views as monitoring_views
from scheduling import views as scheduling_views

urlpatterns = [
    path("", cluster_views.inventory, name="inventory"),
    path("jobs/", scheduling_views.jobs, name="jobs"),
    path("jobs/<int:pk>/", scheduling_views.job_detail, name="job-detail"),
    path("services/", scheduling_views.services, name="services"),
    path("services/<int:pk>/", scheduling_views.service_detail, name="service-detail"),
    path("live/", monitoring_views.live, name="live"),
    path("overview/", monitoring_views.overview_page, name="overview"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("cluster.api.urls")),
    path("api/v1/", include("scheduling.api.urls")),
    path("api/v1/", include("monitoring.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
]
