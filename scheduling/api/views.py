from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster.api.throttling import SubmitThrottle
from cluster.audit import record
from cluster.fields import FieldError
from cluster.permissions import RolePermission, node_of
from scheduling import chargeback, filtersets, history, webhooks
from scheduling.api import queue_serializers
from scheduling.api import serializers as s
from scheduling.api.array_views import JobArraySerializer
from scheduling.api.service_serializers import InferenceServiceSerializer
from scheduling.arrays import submit_array
from scheduling.choices import ACTIVE_STATES
from scheduling.ettr import cluster_ettr
from scheduling.inference import autoscale, save_service, stop_service
from scheduling.launch import request_checkpoint
from scheduling.models import Allocation, CheckpointPolicy, Cohort, InferenceService, Job, Queue
from scheduling.services import (
    JobStateError,
    SubmitError,
    change_state,
    delete_locked,
    record_checkpoint,
    save_policy,
    save_queue,
    set_queue_stopped,
    submit_job,
)


class CheckpointPolicyViewSet(viewsets.ModelViewSet):
    queryset = CheckpointPolicy.objects.all()
    serializer_class = queue_serializers.CheckpointPolicySerializer
    ordering_fields = ["name", "interval_s"]
    search_fields = ["name"]

    def perform_create(self, serializer):
        save_policy(serializer, actor=self.request.user)

    def perform_update(self, serializer):
        save_policy(serializer, actor=self.request.user)

    def perform_destroy(self, instance):
        delete_locked(instance)


class CohortViewSet(viewsets.ModelViewSet):
    queryset = Cohort.objects.prefetch_related("queues")
    serializer_class = queue_serializers.CohortSerializer
    ordering_fields = ["name"]
    search_fields = ["name"]

    def perform_destroy(self, instance):
        delete_locked(instance)


class QueueViewSet(viewsets.ModelViewSet):
    queryset = Queue.objects.select_related("cohort").prefetch_related("quotas__chip_type")
    serializer_class = queue_serializers.QueueSerializer
    filterset_class = filtersets.QueueFilterSet
    ordering_fields = ["name", "priority", "weight"]
    search_fields = ["name", "description"]

    def perform_create(self, serializer):
        save_queue(serializer, actor=self.request.user)

    def perform_update(self, serializer):
        save_queue(serializer, actor=self.request.user)

    def destroy(self, request, *args, **kwargs):
        queue = self.get_object()
        active = queue.jobs.filter(state__in=ACTIVE_STATES).count()
        if active:
            return Response(
                {"detail": f"queue {queue.name} still has {active} active jobs"},
                status=status.HTTP_409_CONFLICT,
            )
        return super().destroy(request, *args, **kwargs)

    def _set_stopped(self, stopped: bool):
        queue = set_queue_stopped(self.get_object(), stopped, actor=self.request.user)
        return Response(self.get_serializer(queue).data)

    @extend_schema(request=None, responses=queue_serializers.QueueSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        """Admit nothing more from this queue; running work keeps running."""
        return self._set_stopped(True)

    @extend_schema(request=None, responses=queue_serializers.QueueSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Admit from this queue again."""
        return self._set_stopped(False)

    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"], url_path="webhook-secret")
    def webhook_secret(self, request, pk=None):
        """A new secret for the queue's webhook signatures, shown this once (the old one stops
        signing at once); audited, without the secret."""
        queue = self.get_object()
        with transaction.atomic():
            secret = webhooks.rotate_secret(queue)
            record(request.user, "rotate webhook secret", "queue", queue, {}, request.data.get("reason", ""))
        return Response({"queue": queue.name, "webhook_secret": secret})


class NodeRunsJob(BasePermission):
    """A node's agent, for a job that holds GPUs on its node (it reports the job's checkpoints)."""

    message = "A node credential may only report for jobs running on its own node."

    def has_permission(self, request, view) -> bool:
        return node_of(request) is not None

    def has_object_permission(self, request, view, obj) -> bool:
        node = node_of(request)
        return node is not None and Allocation.objects.filter(job=obj, node=node, active=True).exists()


class JobViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Submit jobs and follow them; a job changes only through its actions."""

    queryset = Job.objects.select_related("queue", "chip", "forecast").order_by("-id")
    filterset_class = filtersets.JobFilterSet
    ordering_fields = ["id", "submitted_at", "priority", "gpus", "state"]
    search_fields = ["name"]

    def get_serializer_class(self):
        return s.JobDetailSerializer if self.action == "retrieve" else s.JobSerializer

    def get_throttles(self):
        return [SubmitThrottle()] if self.action == "create" else super().get_throttles()

    def get_queryset(self):
        qs = super().get_queryset()
        if self.action == "retrieve":
            qs = qs.prefetch_related("events")
        return qs

    @extend_schema(
        request=s.JobSerializer,
        responses={
            201: PolymorphicProxySerializer(
                component_name="SubmittedJobOrArray",
                serializers=[s.JobSerializer, JobArraySerializer],
                resource_type_field_name=None,  # a job, or with ``array`` the array of its jobs
            )
        },
    )
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        fields = dict(serializer.validated_data)
        spec = fields.pop("array", None)
        # the rules every submit path follows are submit_job's: a broken one is a 400 naming the field
        try:
            if spec is not None:  # a job array: one job per index, answered with the array
                array = submit_array(spec, owner=request.user, **fields)
                data = JobArraySerializer(array, context=self.get_serializer_context()).data
                where = {"Location": f"/api/v1/arrays/{array.pk}/"}
                return Response(data, status=status.HTTP_201_CREATED, headers=where)
            serializer.instance = submit_job(owner=request.user, **fields)
        except SubmitError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        return Response(serializer.data, status=status.HTTP_201_CREATED)

    def _act(self, request, name: str):
        job = self.get_object()
        body = s.JobActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = change_state(
                job.pk, name, actor=request.user.username, reason=body.validated_data["reason"]
            )
        except JobStateError as exc:
            return Response({"state": [str(exc)]}, status=status.HTTP_409_CONFLICT)
        return Response(s.JobDetailSerializer(job, context=self.get_serializer_context()).data)

    @extend_schema(request=s.CheckpointSerializer, responses=s.CheckpointSerializer)
    @action(
        detail=True,
        methods=["post"],
        url_path="checkpoints",
        permission_classes=[RolePermission | NodeRunsJob],
    )
    def report_checkpoint(self, request, pk=None):
        """A running job's nodes report a saved checkpoint (the node agent calls this with its
        node credential, for a job on its node; operators may too)."""
        job = self.get_object()
        if job.state != "running":
            return Response(
                {"state": [f"only a running job saves checkpoints; this one is {job.state}"]},
                status=status.HTTP_409_CONFLICT,
            )
        body = s.CheckpointSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        checkpoint = record_checkpoint(job, **body.validated_data)
        code = (
            status.HTTP_200_OK if checkpoint.duplicate else status.HTTP_201_CREATED
        )  # a replay: nothing new
        return Response(s.CheckpointSerializer(checkpoint).data, status=code)

    @extend_schema(request=s.JobActionSerializer, responses=s.JobDetailSerializer)
    @action(detail=True, methods=["post"], url_path="request-checkpoint")
    def request_checkpoint(self, request, pk=None):
        """Ask a running job on real nodes to save now: each node's agent sends it the checkpoint
        signal (SIGUSR1 by default) and the job reports the checkpoint when saved."""
        job = self.get_object()
        body = s.JobActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = request_checkpoint(
                job.pk, actor=request.user.username, reason=body.validated_data["reason"]
            )
        except JobStateError as exc:
            return Response({"state": [str(exc)]}, status=status.HTTP_409_CONFLICT)
        return Response(s.JobDetailSerializer(job, context=self.get_serializer_context()).data)

    @extend_schema(request=s.JobActionSerializer, responses=s.JobDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel the job and release its GPUs."""
        return self._act(request, "cancel")

    @extend_schema(request=s.JobActionSerializer, responses=s.JobDetailSerializer)
    @action(detail=True, methods=["post"])
    def suspend(self, request, pk=None):
        """Hold the job: release its GPUs and keep its progress until it is resumed."""
        return self._act(request, "suspend")

    @extend_schema(request=s.JobActionSerializer, responses=s.JobDetailSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Put a suspended job back in its queue."""
        return self._act(request, "resume")


class ETTRView(APIView):
    """Effective training time over a window, GPU-weighted over every job that held GPUs in it,
    with the share of each loss bucket."""

    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="Start (default: 24 hours ago)"),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description="End (default: now)"),
            OpenApiParameter("queue", OpenApiTypes.STR, description="Only this queue's jobs"),
        ],
        responses=s.ETTRSerializer,
    )
    def get(self, request):
        params = s.ETTRQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        until = params.validated_data.get("until") or timezone.now()
        since = params.validated_data.get("since") or until - timedelta(hours=24)
        if since >= until:
            return Response({"since": ["must be before until"]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(s.ETTRSerializer(cluster_ettr(since, until, params.validated_data.get("queue"))).data)


USAGE_PARAMETERS = [
    OpenApiParameter("since", OpenApiTypes.DATE, description="First day (default: 30 days back)"),
    OpenApiParameter("until", OpenApiTypes.DATE, description="Last day (default: today)"),
    OpenApiParameter("queue", OpenApiTypes.STR),
    OpenApiParameter("cohort", OpenApiTypes.STR),
    OpenApiParameter("chip_type", OpenApiTypes.STR),
]


class UsageView(APIView):
    """Usage per day, queue (with its cohort) and chip type: GPU-hours allocated, used (weighted
    by utilization), borrowed, lent and lost to preemption, and the cost at each chip type's
    chargeback price; totals per queue and per cohort. ``/api/v1/usage/csv/`` is the same as CSV."""

    csv = False

    @extend_schema(
        parameters=USAGE_PARAMETERS, responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT}
    )
    def get(self, request):
        try:
            data = chargeback.report(**chargeback.window(request.query_params))
        except FieldError as exc:
            return Response({exc.field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)
        if not self.csv:
            return Response(data)
        answer = HttpResponse(chargeback.as_csv(data), content_type="text/csv")
        answer["Content-Disposition"] = f'attachment; filename="usage-{data["since"]}-{data["until"]}.csv"'
        return answer


class UsageCsvView(UsageView):
    csv = True

    @extend_schema(parameters=USAGE_PARAMETERS, responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request):
        return super().get(request)


class QueueHistoryView(APIView):
    """Each queue over a window (default the last 7 days): admissions, mean and p90 wait,
    preemptions and their rate per day; the chip types by p90 wait (under contention from 15 min,
    or with preemptions); the most borrowed quota; the queues starving now (work pending, nothing
    admitted for ``starving_after_s``, default MYRIAD_QUEUE_STARVING_AFTER_S)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME),
            OpenApiParameter("until", OpenApiTypes.DATETIME),
            OpenApiParameter("queue", OpenApiTypes.STR),
            OpenApiParameter("starving_after_s", OpenApiTypes.NUMBER),
        ],
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT},
    )
    def get(self, request):
        try:
            return Response(history.queue_history(**history.window(request.query_params)))
        except FieldError as exc:
            return Response({exc.field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)


class InferenceServiceViewSet(viewsets.ModelViewSet):
    """Inference services: replicas follow the load profile (the autoscaler runs every
    MYRIAD_AUTOSCALE_INTERVAL_S seconds); operators set the profile and the replica bounds."""

    queryset = InferenceService.objects.select_related("queue")
    serializer_class = InferenceServiceSerializer
    ordering_fields = ["name", "load_rps", "desired_replicas"]
    search_fields = ["name"]

    def perform_create(self, serializer):
        save_service(serializer, actor=self.request.user)

    def perform_update(self, serializer):
        save_service(serializer, actor=self.request.user)

    def perform_destroy(self, instance):
        stop_service(instance, self.request.user.username)
        instance.delete()

    @extend_schema(request=None, responses=InferenceServiceSerializer)
    @action(detail=True, methods=["post"])
    def autoscale(self, request, pk=None):
        """Decide now instead of waiting for the next autoscaling tick."""
        service = self.get_object()
        autoscale(service.pk)
        service.refresh_from_db()
        return Response(self.get_serializer(service).data)
