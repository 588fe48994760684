from django.urls import path

from scheduling import views

urlpatterns = [
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:pk>/", views.job_detail, name="job-page"),
    path("services/", views.services, name="services"),
    path("services/<int:pk>/", views.service_detail, name="service-page"),
    path("queues/", views.queues, name="queues"),
    path("usage/", views.usage_page, name="usage"),
    path("queues/history/", views.queue_history_page, name="queue-history"),
    path("queues/<int:pk>/edit/", views.queue_edit, name="queue-edit"),
    path("checkpoint-policies/", views.policies, name="policies"),
    path("checkpoint-policies/new/", views.policy_edit, name="policy-new"),
    path("checkpoint-policies/<int:pk>/edit/", views.policy_edit, name="policy-edit"),
]
