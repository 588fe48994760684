from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from cluster import filtersets
from cluster.agents import create_enrolment_token, revoke
from cluster.api import serializers as s
from cluster.audit import changes, record
from cluster.models import (
    GPU,
    ChipType,
    Datacenter,
    EnrolmentToken,
    Node,
    NodeCredential,
    Pod,
    Rack,
    Region,
)
from cluster.services import apply_node_action


class KeepsChildrenMixin:
    """Refuse to delete a topology level that still holds anything: a mistaken DELETE must not
    silently take thousands of GPUs with it. Empty it first."""

    children: str = ""

    def destroy(self, request, *args, **kwargs):
        obj = self.get_object()
        count = getattr(obj, self.children).count()
        if count:
            return Response(
                {"detail": f"{obj} still holds {count} {self.children}; remove them first"},
                status=status.HTTP_409_CONFLICT,
            )
        return super().destroy(request, *args, **kwargs)


class ChipTypeViewSet(viewsets.ModelViewSet):
    queryset = ChipType.objects.all()
    serializer_class = s.ChipTypeSerializer
    filterset_class = filtersets.ChipTypeFilterSet
    ordering_fields = ["name", "bf16_tflops", "memory_gib", "price_per_gpu_hour"]
    search_fields = ["name", "vendor", "model"]

    def _saved(self, serializer, action: str) -> None:
        """Saved with its audit record: prices are what usage reports charge (scheduling.usage)."""

        def state(chip) -> dict:  # plain values (prices are Decimals) for the record's JSON
            return {
                k: float(v) if isinstance(v, Decimal) else v
                for k, v in serializer.to_representation(chip).items()
            }

        before = {} if serializer.instance is None else state(serializer.instance)
        with transaction.atomic():
            chip = serializer.save()
            diff = changes(before, state(chip))
            diff.pop("id", None)
            if diff:
                record(
                    self.request.user, action, "chip type", chip, diff, self.request.data.get("reason", "")
                )

    def perform_create(self, serializer):
        self._saved(serializer, "create")

    def perform_update(self, serializer):
        self._saved(serializer, "update")


class RegionViewSet(KeepsChildrenMixin, viewsets.ModelViewSet):
    children = "datacenters"
    queryset = Region.objects.annotate(
        datacenter_count=Count("datacenters", distinct=True),
        gpu_count=Coalesce(Sum("datacenters__pods__racks__nodes__gpus_per_node"), 0),
    ).order_by("name")
    serializer_class = s.RegionSerializer
    filterset_class = filtersets.RegionFilterSet
    ordering_fields = ["name", "gpu_count"]


class DatacenterViewSet(KeepsChildrenMixin, viewsets.ModelViewSet):
    children = "pods"
    queryset = (
        Datacenter.objects.select_related("region")
        .annotate(
            pod_count=Count("pods", distinct=True),
            gpu_count=Coalesce(Sum("pods__racks__nodes__gpus_per_node"), 0),
        )
        .order_by("region__name", "name")
    )
    serializer_class = s.DatacenterSerializer
    filterset_class = filtersets.DatacenterFilterSet
    ordering_fields = ["name", "gpu_count", "power_budget_kw"]
    search_fields = ["name", "location"]


class PodViewSet(KeepsChildrenMixin, viewsets.ModelViewSet):
    children = "racks"
    queryset = (
        Pod.objects.select_related("datacenter")
        .annotate(
            rack_count=Count("racks", distinct=True),
            node_count=Count("racks__nodes", distinct=True),
            gpu_count=Coalesce(Sum("racks__nodes__gpus_per_node"), 0),
        )
        .order_by("id")
    )
    serializer_class = s.PodSerializer
    filterset_class = filtersets.PodFilterSet
    ordering_fields = ["id", "name", "gpu_count"]
    search_fields = ["name"]


class RackViewSet(KeepsChildrenMixin, viewsets.ModelViewSet):
    children = "nodes"
    queryset = Rack.objects.annotate(
        node_count=Count("nodes", distinct=True), gpu_count=Coalesce(Sum("nodes__gpus_per_node"), 0)
    ).order_by("id")
    serializer_class = s.RackSerializer
    filterset_class = filtersets.RackFilterSet
    ordering_fields = ["id", "name", "gpu_count"]
    search_fields = ["name"]


class NodeViewSet(viewsets.ModelViewSet):
    queryset = Node.objects.select_related("chip_type", "rack__pod").order_by("id")
    serializer_class = s.NodeSerializer
    filterset_class = filtersets.NodeFilterSet
    ordering_fields = ["id", "hostname", "state", "state_changed_at"]
    search_fields = ["hostname"]

    def _act(self, request, action_name: str, body_class=s.NodeActionSerializer):
        node = self.get_object()
        body = body_class(data=request.data)
        body.is_valid(raise_exception=True)
        grace = body.validated_data.get("grace_s")
        apply_node_action(
            [node],
            action_name,
            actor=request.user.username,
            reason=body.validated_data["reason"],
            deadline=timezone.now() + timedelta(seconds=grace) if grace else None,
        )
        node.refresh_from_db()
        return Response(self.get_serializer(node).data)

    @extend_schema(request=s.NodeActionSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        """Stop placing new work on the node; running work stays."""
        return self._act(request, "cordon")

    @extend_schema(request=s.NodeDrainSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        """Stop placing new work and move running work off the node: each job is checkpointed
        (where its policy can save on demand) and requeued, at once or after ``grace_s`` seconds
        in which it may finish. The node shows ``drained`` once nothing runs on it."""
        return self._act(request, "drain", s.NodeDrainSerializer)

    @extend_schema(request=s.NodeActionSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"], url_path="mark-down")
    def mark_down(self, request, pk=None):
        """Take the node out of service as down (a fault the controller did not see)."""
        return self._act(request, "mark_down")

    @extend_schema(request=s.NodeActionSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def repair(self, request, pk=None):
        """A down node goes to repair."""
        return self._act(request, "repair")

    @extend_schema(request=s.NodeActionSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"], url_path="return")
    def return_to_service(self, request, pk=None):
        """A repaired node returns to service: its GPUs are ready again and its faults cleared."""
        return self._act(request, "return")

    @extend_schema(request=s.NodeActionSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        """Return a cordoned or draining node to service."""
        return self._act(request, "uncordon")


class GPUViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin, viewsets.GenericViewSet
):
    """GPUs are created with their node; operators may change a GPU's state and health."""

    queryset = GPU.objects.select_related("node__chip_type").order_by("id")
    serializer_class = s.GPUSerializer
    filterset_class = filtersets.GPUFilterSet
    ordering_fields = ["id", "index", "state", "health"]
    search_fields = ["uuid", "serial", "node__hostname"]


class EnrolmentTokenViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """One-time tokens a new node's agent trades for its credential. The token itself is in the
    answer to the create only; the database keeps its digest."""

    queryset = EnrolmentToken.objects.select_related("node", "used_for").order_by("-created_at", "-id")
    serializer_class = s.EnrolmentTokenSerializer
    ordering_fields = ["created_at", "expires_at"]

    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        token, secret = create_enrolment_token(
            actor=request.user.username,
            node=body.validated_data.get("node"),
            ttl_s=body.validated_data["ttl_s"],
        )
        return Response({**self.get_serializer(token).data, "token": secret}, status=status.HTTP_201_CREATED)


class NodeCredentialViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Node agents' credentials with their last use; revoke one to refuse its node at once."""

    queryset = NodeCredential.objects.select_related("node").order_by("node_id", "-created_at")
    serializer_class = s.NodeCredentialSerializer
    filterset_fields = ["node", "revoked_at"]
    ordering_fields = ["created_at", "last_used_at"]

    @extend_schema(request=s.NodeActionSerializer, responses=s.NodeCredentialSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the credential: the node's agent is refused from its next request on."""
        credential = self.get_object()
        body = s.NodeActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        revoke(credential, actor=request.user.username, reason=body.validated_data["reason"])
        return Response(self.get_serializer(credential).data)
