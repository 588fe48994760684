from rest_framework.routers import DefaultRouter

from cluster.api import views

router = DefaultRouter()
router.register("chip-types", views.ChipTypeViewSet)
router.register("regions", views.RegionViewSet)
router.register("datacenters", views.DatacenterViewSet)
router.register("datacenter-links", views.DatacenterLinkViewSet)
router.register("pods", views.PodViewSet)
router.register("racks", views.RackViewSet)
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GPUViewSet)

urlpatterns = router.urls
