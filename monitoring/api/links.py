"""``/api/v1/links/``: the links between datacenters as part of the fleet: capacity in lanes, a
latency, a state, and the load of the jobs crossing each (and ``/api/v1/partitions/``: sites the
control plane could not reach). Operators create and change them, and
mark lanes lost, a link down or up, each with a reason in the audit.

Marking a link down is a ``link_down`` fault on it: the jobs crossing it stop (their collectives
hang) and recover like any interrupted job. Marking it down again while it is down is the same
event: 200 with the link, nothing recorded twice. Lanes lost re-plan the jobs crossing it over
the thinner link (their step time and the slowdown in a job event)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response

from cluster.audit import record
from cluster.filtersets import DatacenterLinkFilterSet
from cluster.models import DatacenterLink
from engine.sites import default_latency_ms, min_latency_ms
from monitoring.faults import partitions
from monitoring.faults.services import report_fault
from monitoring.models import SitePartition
from scheduling.locks import locked_transaction
from scheduling.replan import replan_crossing
from scheduling.sites import jobs_crossing, load_of, running_loads
from scheduling.trigger import request_cycle


class LinkSerializer(serializers.ModelSerializer):
    a_name = serializers.CharField(source="a.name", read_only=True)
    b_name = serializers.CharField(source="b.name", read_only=True)
    latency_ms = serializers.FloatField(
        required=False, help_text="One-way; default 5 us per km of fibre (never below 4.9 us per km)"
    )
    lanes = serializers.IntegerField(min_value=1, required=False, default=8)
    lane_gbps = serializers.FloatField(min_value=0.001, required=False, default=400.0)
    state = serializers.CharField(read_only=True, help_text="up, degraded (lanes lost) or down")
    bandwidth_gbps = serializers.FloatField(read_only=True, help_text="every lane")
    capacity_gbps = serializers.FloatField(read_only=True, help_text="the lanes left; 0 when down")
    load_gbps = serializers.SerializerMethodField(help_text="the shares the running jobs crossing it took")
    utilization = serializers.SerializerMethodField(help_text="load / capacity (above 1: over capacity)")

    class Meta:
        model = DatacenterLink
        fields = [
            "id",
            "a",
            "b",
            "a_name",
            "b_name",
            "distance_km",
            "latency_ms",
            "lanes",
            "lane_gbps",
            "lanes_lost",
            "state",
            "state_reason",
            "state_changed_at",
            "bandwidth_gbps",
            "capacity_gbps",
            "load_gbps",
            "utilization",
        ]
        read_only_fields = ["lanes_lost", "state_reason", "state_changed_at"]

    def _figures(self, link) -> tuple[float, float | None]:
        loads = self.context.get("loads")
        if loads is None:  # read once per response, however many links it lists
            loads = self.context["loads"] = running_loads()
        return load_of(link, loads)

    def get_load_gbps(self, link) -> float:
        return round(self._figures(link)[0], 3)

    def get_utilization(self, link) -> float | None:
        util = self._figures(link)[1]
        return None if util is None else round(util, 4)

    def validate(self, attrs):
        a = attrs.get("a", getattr(self.instance, "a", None))
        b = attrs.get("b", getattr(self.instance, "b", None))
        if a is not None and a == b:
            raise serializers.ValidationError({"b": "a link joins two different datacenters"})
        if a and b and a.pk > b.pk:
            attrs["a"], attrs["b"] = a, b = b, a
        same = DatacenterLink.objects.filter(a=a, b=b)
        if self.instance is not None:
            same = same.exclude(pk=self.instance.pk)
        if a and b and same.exists():
            raise serializers.ValidationError({"b": f"a link between {a} and {b} exists"})
        distance = attrs.get("distance_km", getattr(self.instance, "distance_km", 0.0))
        if distance < 0:
            raise serializers.ValidationError({"distance_km": "must not be negative"})
        if "latency_ms" not in attrs and (self.instance is None or "distance_km" in attrs):
            latency = attrs["latency_ms"] = default_latency_ms(distance)
        else:
            latency = attrs.get("latency_ms", getattr(self.instance, "latency_ms", 0.0))
        if latency < min_latency_ms(distance) - 1e-12:
            raise serializers.ValidationError(
                {
                    "latency_ms": f"{latency} ms is below what light in fibre needs for {distance:g} km "
                    f"({min_latency_ms(distance):.3f} ms)"
                }
            )
        lanes = attrs.get("lanes", getattr(self.instance, "lanes", 1))
        if self.instance is not None and lanes < self.instance.lanes_lost:
            raise serializers.ValidationError(
                {"lanes": f"fewer than the {self.instance.lanes_lost} lanes lost"}
            )
        return attrs


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class LanesLostSerializer(ReasonSerializer):
    lanes_lost = serializers.IntegerField(min_value=0)


class LinkViewSet(viewsets.ModelViewSet):
    """Links between datacenters: lanes, latency, state and the load of the jobs crossing them."""

    queryset = DatacenterLink.objects.select_related("a", "b").order_by("a_id", "b_id")
    serializer_class = LinkSerializer
    filterset_class = DatacenterLinkFilterSet
    ordering_fields = ["latency_ms", "distance_km", "lanes"]

    def perform_create(self, serializer):
        with transaction.atomic():
            link = serializer.save()
            record(self.request.user, "create", "link", link, {"lanes": [None, link.lanes]})
        request_cycle()

    @extend_schema(request=LanesLostSerializer, responses=LinkSerializer)
    @action(detail=True, methods=["post"], url_path="lanes-lost")
    def lanes_lost(self, request, pk=None):
        """Lanes of the link are lost (a wavelength down) or back: its capacity is the lanes left,
        and every job crossing it is re-planned over it (the slowdown in its events)."""
        body = LanesLostSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        lost, reason = body.validated_data["lanes_lost"], body.validated_data["reason"]
        with locked_transaction():
            link = get_object_or_404(
                DatacenterLink.objects.select_for_update(of=("self",)).select_related("a", "b"), pk=pk
            )
            if lost > link.lanes:
                raise serializers.ValidationError({"lanes_lost": f"the link has {link.lanes} lanes"})
            if lost != link.lanes_lost:
                before = link.state
                link.lanes_lost, link.state_reason, link.state_changed_at = lost, reason, timezone.now()
                link.save(update_fields=["lanes_lost", "state_reason", "state_changed_at"])
                record(
                    request.user,
                    "lanes_lost",
                    "link",
                    link,
                    {"lanes_lost": [None, lost], "state": [before, link.state]},
                    reason,
                )
                if link.state != "down":
                    replan_crossing(link, f"link {link} has {link.lanes - lost} of {link.lanes} lanes")
        request_cycle()
        return Response(LinkSerializer(link, context={"request": request}).data)

    @extend_schema(request=ReasonSerializer, responses=LinkSerializer)
    @action(detail=True, methods=["post"], url_path="mark-down")
    def mark_down(self, request, pk=None):
        """The link carries nothing: a ``link_down`` fault; the jobs crossing it recover. Marking a
        link that is down again changes nothing."""
        return self._set_down(request, pk, True)

    @extend_schema(request=ReasonSerializer, responses=LinkSerializer)
    @action(detail=True, methods=["post"], url_path="mark-up")
    def mark_up(self, request, pk=None):
        """The link carries traffic again (with the lanes not lost)."""
        return self._set_down(request, pk, False)

    def _set_down(self, request, pk, down: bool):
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reason = body.validated_data["reason"]
        with transaction.atomic():
            link = get_object_or_404(
                DatacenterLink.objects.select_for_update(of=("self",)).select_related("a", "b"), pk=pk
            )
            if link.down != down:
                before = link.state
                link.down, link.state_reason, link.state_changed_at = down, reason, timezone.now()
                link.save(update_fields=["down", "state_reason", "state_changed_at"])
                record(
                    request.user,
                    "mark_down" if down else "mark_up",
                    "link",
                    link,
                    {"state": [before, link.state]},
                    reason,
                )
                if down:
                    crossing = jobs_crossing(link)
                    report_fault(
                        source="link_down",
                        link=link,
                        description=(reason or f"link {link} marked down")[:255],
                        data={"marked_by": getattr(request.user, "username", ""), "jobs_crossing": crossing},
                    )
        request_cycle()
        return Response(LinkSerializer(link, context={"request": request}).data)


class PartitionSerializer(serializers.ModelSerializer):
    datacenter_name = serializers.CharField(source="datacenter.name", read_only=True)

    class Meta:
        model = SitePartition
        fields = [
            "id",
            "datacenter",
            "datacenter_name",
            "started_at",
            "detected_at",
            "ended_at",
            "source",
            "nodes",
            "reason",
            "ended_reason",
        ]
        read_only_fields = ["started_at", "detected_at", "ended_at", "source", "nodes", "ended_reason"]


class PartitionViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Datacenters the control plane could not reach: opened when every agent there went silent at
    once, or by an operator (POST: the path to the site is down); while open nothing new is placed
    there and nobody there is requeued. Declaring one for a datacenter already partitioned answers
    the open one."""

    queryset = SitePartition.objects.select_related("datacenter").order_by("-started_at", "-id")
    serializer_class = PartitionSerializer
    filterset_fields = ["datacenter", "source"]
    ordering_fields = ["started_at"]

    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        partition = partitions.declare(
            data["datacenter"], data.get("reason", ""), request.user, timezone.now()
        )
        request_cycle()
        return Response(self.get_serializer(partition).data, status=201)

    @extend_schema(request=ReasonSerializer, responses=PartitionSerializer)
    @action(detail=True, methods=["post"])
    def end(self, request, pk=None):
        """The datacenter is reachable again: new work may be placed there."""
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        partition = partitions.end(
            self.get_object(), body.validated_data["reason"], request.user, timezone.now()
        )
        request_cycle()
        return Response(self.get_serializer(partition).data)
