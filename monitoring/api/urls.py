from rest_framework.routers import DefaultRouter

from monitoring.api import views

router = DefaultRouter()
router.register("faults", views.FaultEventViewSet)

urlpatterns = router.urls
