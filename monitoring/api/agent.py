"""The node agent's endpoints: enrol, report, assignments. A node credential reaches only these
(and the checkpoint report of a job on its node); every other endpoint answers it 403."""

from __future__ import annotations

import time

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster.agents import EnrolmentError, enrol
from cluster.api.throttling import EnrolThrottle
from cluster.permissions import IsNodeAgent, node_of
from monitoring.telemetry.reports import handle_report
from scheduling.launch import assignments
from scheduling.trigger import assignments_version

MAX_WAIT_S = 25.0


class EnrolSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=128)
    address = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    gpus = serializers.IntegerField(min_value=0, max_value=72, required=False, allow_null=True)
    agent_version = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")


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
        return Response({"version": version, "node": node.hostname, "assignments": assignments(node)})
