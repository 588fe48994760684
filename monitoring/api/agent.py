"""The node agent's endpoints: enrol, report, assignments. A node credential reaches only these
(and the checkpoint report of a job on its node); every other endpoint answers it 403."""

from __future__ import annotations

import time

import orjson
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster.agents import EnrolmentError, enrol
from cluster.api.throttling import EnrolThrottle
from cluster.fields import FieldError
from cluster.permissions import IsNodeAgent, node_of
from cluster.ports import parse_inventory
from monitoring.telemetry import netreports
from monitoring.telemetry.livestore import live_store
from monitoring.telemetry.reports import handle_report
from scheduling.launch import assignments
from scheduling.trigger import assignments_version

MAX_WAIT_S = 25.0
TRACE_MAX_BYTES = 2_500_000  # 60 s of 10 ms windows of 8 ports is ~1.6 MB


class EnrolSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=128)
    address = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    gpus = serializers.IntegerField(min_value=0, max_value=72, required=False, allow_null=True)
    agent_version = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    ports = serializers.JSONField(
        required=False, help_text="The node's network ports: [{name, kind, rail, rate_gbps}]"
    )

    def validate_ports(self, value):
        try:
            return parse_inventory(value)
        except FieldError as exc:
            raise serializers.ValidationError(str(exc)) from None


class EnrolView(APIView):
    """Trade a one-time enrolment token for this node's credential (shown once)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [EnrolThrottle]

    @extend_schema(request=EnrolSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        body = EnrolSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            credential, secret = enrol(
                data["token"],
                hostname=data["hostname"],
                address=data["address"],
                agent_version=data["agent_version"],
                gpus=data.get("gpus"),
                ports=data.get("ports"),
            )
        except EnrolmentError as exc:
            code = status.HTTP_403_FORBIDDEN if exc.field == "token" else status.HTTP_400_BAD_REQUEST
            return Response({exc.field: [exc.message]}, status=code)
        node = credential.node
        return Response(
            {"node": node.pk, "hostname": node.hostname, "gpus": node.gpus_per_node, "credential": secret},
            status=status.HTTP_201_CREATED,
        )


class ReportView(APIView):
    """A node's batched report: readings of its GPUs, XIDs, and its job processes' states. The
    ASGI server answers this path itself with the same function (monitoring.telemetry.agent_asgi)."""

    # handle_report checks the node credential itself (answering 401 and 403 as the ASGI path
    # does), so DRF's authentication would only read it a second time
    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes: list = []  # the body is read raw: its size is checked before it is parsed

    @extend_schema(
        request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT}, auth=[{"nodeCredential": []}]
    )
    def post(self, request):
        code, answer = handle_report(request.META.get("HTTP_AUTHORIZATION", ""), request.body)
        return Response(answer, status=code)


class AssignmentsView(APIView):
    """What this node must run. With ``version`` (the last one seen) the answer waits up to
    ``wait`` seconds (at most 25) for a change: a long poll."""

    permission_classes = [IsNodeAgent]

    @extend_schema(
        parameters=[
            OpenApiParameter("version", int, required=False),
            OpenApiParameter("wait", float, required=False),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request):
        node = node_of(request)
        try:
            seen = int(request.query_params.get("version", -1))
            wait = min(max(float(request.query_params.get("wait", 0)), 0.0), MAX_WAIT_S)
        except ValueError:
            return Response(
                {"version": ["version is a whole number and wait a number of seconds"]}, status=400
            )
        deadline = time.monotonic() + wait
        version = assignments_version()
        while version == seen and time.monotonic() < deadline:
            time.sleep(0.2)
            version = assignments_version()
        answer = {"version": version, "node": node.hostname, "assignments": assignments(node)}
        asked = netreports.trace_request(node.pk, live_store())
        if asked is not None:  # an operator asked for the node's recorded 10 ms windows
            answer["trace"] = {"asked_at": asked["asked_at"], "seconds": asked["seconds"]}
        return Response(answer)


class TraceView(APIView):
    """The node's recorded trace (its ports' last seconds of 10 ms windows), asked for by an
    operator and announced in the node's assignments; a malformed one is refused by field."""

    permission_classes = [IsNodeAgent]
    parser_classes: list = []  # read raw: its size is checked before it is parsed

    @extend_schema(request=OpenApiTypes.OBJECT, responses={201: OpenApiTypes.OBJECT})
    def post(self, request):
        node = node_of(request)
        raw = request.body
        if len(raw) > TRACE_MAX_BYTES:
            return Response({"body": [f"the trace is {len(raw)} bytes; the limit is {TRACE_MAX_BYTES}"]}, 413)
        try:
            body = orjson.loads(raw or b"null")
            trace = netreports.parse_trace(body, netreports.read_ports(node.pk))
        except orjson.JSONDecodeError as exc:
            return Response({"body": [f"not JSON ({exc})"]}, status=400)
        except FieldError as exc:
            return Response({exc.field: [exc.message]}, status=400)
        kept = netreports.store_trace(node.pk, trace, live_store())
        return Response({"received_at": kept["received_at"], "windows": len(trace["t_ms"])}, status=201)
