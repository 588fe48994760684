from django.urls import path
from rest_framework.routers import DefaultRouter

from scheduling.api import views

router = DefaultRouter()
router.register("checkpoint-policies", views.CheckpointPolicyViewSet)
router.register("cohorts", views.CohortViewSet)
router.register("queues", views.QueueViewSet)
router.register("jobs", views.JobViewSet)
router.register("services", views.InferenceServiceViewSet)

urlpatterns = [path("ettr/", views.ETTRView.as_view(), name="ettr"), *router.urls]
