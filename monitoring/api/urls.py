from rest_framework.routers import DefaultRouter

from monitoring.api import views

router = DefaultRouter()
router.register("faults", views.FaultEventViewSet)
router.register("simulations", views.SimulationViewSet)

urlpatterns = router.urls
