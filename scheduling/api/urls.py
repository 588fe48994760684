from rest_framework.routers import DefaultRouter

from scheduling.api import views

router = DefaultRouter()
router.register("cohorts", views.CohortViewSet)
router.register("queues", views.QueueViewSet)
router.register("jobs", views.JobViewSet)

urlpatterns = router.urls
