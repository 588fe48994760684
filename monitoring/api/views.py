from __future__ import annotations

import numpy as np
import orjson
from django.conf import settings
from django.db import transaction
from django.http import FileResponse, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster.audit import record
from cluster.fields import FieldError
from cluster.models import NicPort, Node
from cluster.snapshot import topology_cache
from engine.frames import FRAME_METRICS, decode_frame
from engine.levels import LEVELS
from monitoring import filtersets
from monitoring.api.serializers import (
    CongestionRecordSerializer,
    DomainDrainSerializer,
    FaultEventSerializer,
    SimulationSerializer,
)
from monitoring.faults.drain_preview import drain, preview
from monitoring.faults.services import report_fault
from monitoring.models import CongestionRecord, FaultEvent, Simulation
from monitoring.tasks import run_simulation_task
from monitoring.telemetry import efficiency, fabric, netreports
from monitoring.telemetry.ingest import latest_reports
from monitoring.telemetry.levels import LevelQueryError, UnknownDomain, find, level_view, parse
from monitoring.telemetry.livestore import FRAME_KEY, NETWORK_KEY, live_store
from monitoring.telemetry.overview import WINDOWS, ettr_last_day, history, overview
from monitoring.whatif.simulations import report_path
from scheduling.usage import queue_health


class CongestionRecordViewSet(viewsets.ReadOnlyModelViewSet):
    """Fabric links that stayed congested (their ports' p99 windows or CNP rate at the threshold
    for MYRIAD_FABRIC_CONGESTION_MIN_S): start, end (empty while open), peaks, jobs across it."""

    queryset = CongestionRecord.objects.select_related("pod").order_by("-started_at", "-id")
    serializer_class = CongestionRecordSerializer
    filterset_class = filtersets.CongestionRecordFilterSet
    ordering_fields = ["started_at", "peak_p99"]


class FaultEventViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Faults as the controller saw them; operators may inject one (an XID on a GPU, a node down,
    a link down) to watch recovery happen."""

    queryset = FaultEvent.objects.select_related("node", "gpu__node").order_by("-at", "-id")
    serializer_class = FaultEventSerializer
    filterset_class = filtersets.FaultEventFilterSet
    ordering_fields = ["at", "recovery_s"]

    IDENTITY = ("source", "xid", "node", "gpu", "pod", "link", "at")

    def create(self, request, *args, **kwargs):
        """A fault reported twice with the same time (a retry, a replay) is the first one: 200
        with it, nothing handled again. Without ``at`` each report is a fault of its own."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if "at" in data:
            with transaction.atomic():
                same = FaultEvent.objects.filter(**{f: data.get(f) for f in self.IDENTITY}).first()
            if same is not None:
                return Response(self.get_serializer(same).data, status=status.HTTP_200_OK)
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer):
        serializer.instance = report_fault(
            data={"reported_by": self.request.user.username}, **serializer.validated_data
        )


class SimulationViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """What-if simulations: POST starts one as a Celery task; GET follows its progress and summary;
    .../report/ is the self-contained HTML report."""

    queryset = Simulation.objects.prefetch_related("parts")
    serializer_class = SimulationSerializer
    ordering_fields = ["created_at"]

    def perform_create(self, serializer):
        sim = serializer.save(created_by=self.request.user.username)
        transaction.on_commit(lambda: run_simulation_task.delay(sim.pk))

    @extend_schema(responses={(200, "text/html"): OpenApiTypes.STR})
    @action(detail=True, methods=["get"])
    def report(self, request, pk=None):
        sim = self.get_object()
        path = report_path(sim)
        if sim.state != Simulation.State.DONE or not path.exists():
            return Response({"detail": f"simulation {sim.pk} is {sim.state}; no report yet"}, status=409)
        return FileResponse(path.open("rb"), content_type="text/html")


class TelemetryFrameView(APIView):
    """The newest telemetry frame of every GPU, as written by the node agents or the simulated fleet:
    application/octet-stream, b"MYRF", version 1, sequence (u32), simulated time (f64), GPUs (u32),
    then one byte per GPU for utilization %, memory %, temperature (C), power (% of TDP) and health.
    GPUs are in the inventory's order (node, then index on the node); ?since=SEQ answers 204 when
    nothing newer is there."""

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 204: None, 404: None})
    def get(self, request):
        data = live_store().get(FRAME_KEY)
        if data is None:
            return Response({"detail": "no telemetry yet"}, status=404)
        since = request.query_params.get("since")
        if since is not None and since.isdigit() and decode_frame(data)[0] <= int(since):
            return HttpResponse(status=204)
        return HttpResponse(data, content_type="application/octet-stream")


class NetworkView(APIView):
    """Uplink utilization of every rack and pod (load / capacity; above 1: congested), from the
    traffic the running training jobs' modelled plans generate; written by the simulated fleet."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: None})
    def get(self, request):
        data = live_store().get(NETWORK_KEY)
        if data is None:
            return Response({"detail": "no network figures yet"}, status=404)
        return HttpResponse(data, content_type="application/json")


class NodePortsView(APIView):
    """A node's network ports (name, kind, rail, rate) and what its agent's newest report says of
    each: bytes each way, utilization over 10 ms windows (mean, p50, p99, max), bursts, CNP and
    ECN per second, the share of windows waiting to transmit, errors, link flaps; and the state
    of a recorded trace (asked for, received)."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: None})
    def get(self, request, pk: int):
        node = get_object_or_404(Node, pk=pk)
        store = live_store()
        entry = latest_reports([node.pk], store).get(node.pk) or {}
        latest = {p["port"]: p for p in entry.get("net") or []}
        ports = [
            {
                "name": port.name,
                "kind": port.kind,
                "rail": port.rail,
                "rate_gbps": port.rate_gbps,
                "latest": latest.get(port.name),
            }
            for port in NicPort.objects.filter(node=node)
        ]
        trace = netreports.newest_trace(node.pk, store)
        return Response(
            {
                "node": node.hostname,
                "reported_at": entry.get("t"),
                "ports": ports,
                "trace_requested": netreports.trace_request(node.pk, store),
                "trace_received_at": orjson.loads(trace)["received_at"] if trace else None,
            }
        )


class RecordSerializer(serializers.Serializer):
    seconds = serializers.FloatField(min_value=1, max_value=60, default=60)


class NodePortsRecordView(APIView):
    """Ask the node's agent for the last seconds (1 to 60) of its ports' 10 ms windows: it sends
    them with its next poll of its assignments (within 20 s); then ``ports/trace/`` has them."""

    @extend_schema(request=RecordSerializer, responses={202: OpenApiTypes.OBJECT, 404: None})
    def post(self, request, pk: int):
        node = get_object_or_404(Node, pk=pk)
        body = RecordSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not NicPort.objects.filter(node=node).exists():
            return Response({"detail": f"node {node} has reported no network ports"}, status=409)
        seconds = body.validated_data["seconds"]
        asked = netreports.ask_for_trace(node.pk, seconds, request.user.username, live_store())
        record(request.user, "record network trace", "node", node, {}, f"{asked['seconds']:g} s")
        return Response(asked, status=202)


class NodePortsTraceView(APIView):
    """The node's newest recorded trace: per port, utilization each way and the congestion
    counters per 10 ms window, the state's changes."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: None})
    def get(self, request, pk: int):
        node = get_object_or_404(Node, pk=pk)
        data = netreports.newest_trace(node.pk, live_store())
        if data is None:
            return Response({"detail": f"no trace recorded on node {node} yet"}, status=404)
        return HttpResponse(data, content_type="application/json")


class FabricView(APIView):
    """The fabric's switch links, from the agents' port summaries (or the simulated fleet's
    modelled ports): per rail leaf (pod x rail) and per pod uplink, utilization (load over
    capacity), the worst port's p99 over 10 ms windows, CNPs per second, ports down, and which
    are congested; ``congested_pods``: the pods a congested link touches."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: None})
    def get(self, request):
        data = live_store().get(fabric.FABRIC_KEY)
        if data is None:
            return Response({"detail": "no fabric figures yet: no agent has reported its ports"}, status=404)
        return HttpResponse(data, content_type="application/json")


class TelemetryLayoutView(APIView):
    """How the telemetry frame's GPUs sit in the cluster: racks in order (name, first GPU, GPU count),
    nodes in order (hostname, first GPU); GPUs are ordered by node, nodes by rack."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):

        snap = topology_cache.structure()
        node_start = np.searchsorted(snap.gpu_node, np.arange(snap.num_nodes)).tolist()
        rack_of_gpu = snap.node_rack[snap.gpu_node]
        rack_start = np.searchsorted(rack_of_gpu, np.arange(len(snap.rack_id))).tolist()
        rack_count = np.bincount(rack_of_gpu, minlength=len(snap.rack_id)).tolist()
        return Response(
            {
                "gpus": snap.num_gpus,
                "racks": list(snap.names.get("rack", [str(i) for i in snap.rack_id.tolist()])),
                "rack_ids": snap.rack_id.tolist(),
                "pods": list(snap.names.get("pod", ())),
                "rack_pod": snap.rack_pod.tolist(),
                "rack_gpu_start": rack_start,
                "rack_gpu_count": rack_count,
                "hostnames": list(snap.node_hostname),
                "node_gpu_start": node_start,
            }
        )


def _refusal(exc, code: int = 400) -> Response:
    """A fleet view's or drain's query refused: 404 for what does not exist, else ``code``."""

    return Response({exc.field: [exc.message]}, status=404 if isinstance(exc, UnknownDomain) else code)


class TelemetryLevelsView(APIView):
    """The newest frame a level at a time, for the operator's drill-down: the cells of ``level``
    (datacenter, pod, rack, node or gpu; default pod) inside ``within`` (``LEVEL:ID`` of a level
    above, e.g. ``datacenter:3``; default the whole cluster), each with ``aggregate`` (mean, max,
    above: the share of GPUs at or over ``threshold``, unhealthy: GPUs not healthy) of ``metric``
    (util, memory, temperature, power, health), its GPU count and its GPUs not healthy; ``path``
    names the domains from the datacenter down to ``within``. Computed once per frame per server
    process, whatever the number of viewers."""

    @extend_schema(
        parameters=[
            OpenApiParameter("level", str, enum=list(LEVELS)),
            OpenApiParameter("within", str, description="LEVEL:ID of a domain above the level"),
            OpenApiParameter("metric", str, enum=list(FRAME_METRICS)),
            OpenApiParameter("aggregate", str, enum=["mean", "max", "above", "unhealthy", "faults"]),
            OpenApiParameter("threshold", int, description="0-255, for aggregate=above (default 80)"),
        ],
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT},
    )
    def get(self, request):

        try:
            query = parse(request.query_params)
        except LevelQueryError as exc:
            return Response({exc.field: [exc.message]}, status=400)
        frame = live_store().get(FRAME_KEY)
        if frame is None:
            return Response({"detail": "no telemetry yet"}, status=404)
        try:
            return Response(level_view(topology_cache.structure(), frame, query))
        except LevelQueryError as exc:
            return _refusal(exc, 409)  # 409: a frame of another inventory than the one loaded


class EfficiencyView(APIView):
    """Jobs ranked by idle GPU-hours (most first), with their owners, mean utilization, memory and
    power over their life and the GPUs wasted now (held, below MYRIAD_IDLE_UTIL_PCT for
    MYRIAD_IDLE_AFTER_S); ``wasted_by_queue`` sums those."""

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=list(efficiency.RANK_STATES)),
            OpenApiParameter("queue", str),
            OpenApiParameter("limit", int, description="1-1000 (default 100)"),
        ],
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT},
    )
    def get(self, request):
        params = request.query_params
        raw = params.get("limit", "100")
        if not raw.isdigit():
            return Response({"limit": [f"must be a whole number, not {raw!r}"]}, status=400)
        try:
            rows = efficiency.ranking(
                state=params.get("state", "running"), queue=params.get("queue") or None, limit=int(raw)
            )
        except FieldError as exc:
            return Response({exc.field: [exc.message]}, status=400)
        return Response(
            {
                "idle_util_pct": settings.IDLE_UTIL_PCT,
                "idle_after_s": settings.IDLE_AFTER_S,
                "wasted_by_queue": efficiency.wasted_by_queue(),
                "results": rows,
            }
        )


class TelemetryLevelsFindView(APIView):
    """Find a datacenter, pod or rack by name, a node by hostname, a GPU by UUID or a job by id or
    name (``q``), with the fleet view (level, within) that shows each; at most 20."""

    @extend_schema(
        parameters=[OpenApiParameter("q", str, required=True)], responses={200: OpenApiTypes.OBJECT}
    )
    def get(self, request):

        q = request.query_params.get("q", "")
        if len(q) > 200 or "\x00" in q:
            return Response({"q": ["must be at most 200 characters, without NUL"]}, status=400)
        return Response({"q": q, "results": find(topology_cache.structure(), q)})


class DrainPreviewView(APIView):
    """Before draining or marking down (``action``: drain, the default, or mark-down) a node, rack
    or pod (``within``: ``node:ID``, ``rack:ID`` or ``pod:ID``): the jobs it would hit, their GPUs
    there and in all, the work since each one's last checkpoint and what the action would lose of
    it, and where each could run instead right now. POST with a ``reason`` (required, audited) and,
    for a drain, an optional ``grace_s`` takes the action on every node of the domain it may take
    (operators); the others (already draining, down or in repair, say) are left as they are."""

    @extend_schema(
        parameters=[
            OpenApiParameter("within", str, required=True, description="node:ID, rack:ID or pod:ID"),
            OpenApiParameter("action", str, enum=["drain", "mark-down"]),
        ],
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT},
    )
    def get(self, request):

        try:
            params = request.query_params
            within, action = params.get("within", ""), params.get("action", "drain")
            return Response(preview(topology_cache.current(), within, action=action))
        except LevelQueryError as exc:
            return _refusal(exc)

    @extend_schema(
        request=DomainDrainSerializer, responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT}
    )
    def post(self, request):

        body = DomainDrainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            done = drain(
                topology_cache.current(),
                body.validated_data["within"],
                actor=request.user.username,
                reason=body.validated_data["reason"],
                grace_s=body.validated_data["grace_s"],
                action=body.validated_data["action"],
            )
        except LevelQueryError as exc:
            return _refusal(exc)
        return Response(done)


class OverviewView(APIView):
    """GPUs by state (free, allocated, allocated but idle, cordoned, down, in repair) as counts and
    shares, the busy share, running and pending jobs, faults per hour over 24 h, open faults."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):

        return Response({**overview(), "ettr_24h": ettr_last_day(), "queues": queue_health()})


class OverviewHistoryView(APIView):
    """Cluster samples over the last hour, day or week (`?window=hour|day|week`), thinned to at
    most 360 points: GPUs by state, running and pending jobs, faults in the hour before each sample."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):

        window = request.query_params.get("window", "day")
        if window not in WINDOWS:
            return Response({"window": [f"must be one of {', '.join(WINDOWS)}"]}, status=400)
        return Response(history(window))
