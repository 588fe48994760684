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
    path("jobs/<int:pk>/", scheduling_views.job_detail, name="job-page"),
    path("services/", scheduling_views.services, name="services"),
    path("services/<int:pk>/", scheduling_views.service_detail, name="service-page"),
    path("live/", monitoring_views.live, name="live"),
    path("overview/", monitoring_views.overview_page, name="overview"),
    path("topology/", monitoring_views.topology, name="topology"),
    path("topology/<str:level>/<int:pk>/", monitoring_views.topology, name="topology-level"),
    path("nodes/<str:hostname>/", monitoring_views.node_detail, name="node-page"),
    path("gpus/<int:pk>/", monitoring_views.gpu_redirect, name="gpu-page"),
    path("faults/", monitoring_views.faults, name="faults"),
    path("simulations/", monitoring_views.simulations, name="simulations"),
    path("simulations/<int:pk>/", monitoring_views.simulation_detail, name="simulation-page"),
    path("queues/", scheduling_views.queues, name="queues"),
    path("queues/<int:pk>/edit/", scheduling_views.queue_edit, name="queue-edit"),
    path("policies/", scheduling_views.policies, name="policies"),
    path("policies/new/", scheduling_views.policy_edit, name="policy-new"),
    path("policies/<int:pk>/edit/", scheduling_views.policy_edit, name="policy-edit"),
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
