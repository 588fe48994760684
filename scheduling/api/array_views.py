"""Job arrays in the API: submitted through POST /api/v1/jobs/ with ``array``, listed and acted
on here as one, or some indices at a time (scheduling.arrays)."""

from __future__ import annotations

from django.db.models import Count, Q
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from scheduling import arrays
from scheduling.choices import JobState
from scheduling.models import JobArray
from scheduling.services import SubmitError


class JobArraySerializer(serializers.ModelSerializer):
    queue = serializers.CharField(source="queue.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True, allow_null=True)
    states = serializers.SerializerMethodField(help_text="How many of its jobs are in each state")
    jobs = serializers.SerializerMethodField(help_text="Its jobs, through the jobs list")

    class Meta:
        model = JobArray
        fields = ["id", "name", "queue", "owner", "spec", "size", "max_running", "submitted_at"]
        fields += ["states", "jobs"]
        read_only_fields = fields

    def get_states(self, array: JobArray) -> dict[str, int]:
        counted = getattr(array, "counted", None)
        if counted is not None:  # annotated by the list's one query
            return counted
        return arrays.state_counts(array)

    def get_jobs(self, array: JobArray) -> str:
        return f"/api/v1/jobs/?array={array.pk}"


class ArrayActionSerializer(serializers.Serializer):
    indices = serializers.CharField(
        required=False,
        max_length=4096,
        help_text='Only these indices, e.g. "7" or "0-99"; absent: the whole array',
    )
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class ArrayActionResultSerializer(serializers.Serializer):
    changed = serializers.IntegerField(help_text="Jobs the action changed")
    array = JobArraySerializer()


_COUNTS = {state: Count("jobs", filter=Q(jobs__state=state)) for state in JobState.values}


class JobArrayViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Job arrays with their jobs counted by state; cancel, hold (pending jobs wait, running ones
    run on) and release act on the whole array or on ``indices``."""

    queryset = JobArray.objects.select_related("queue", "owner").order_by("-id")
    serializer_class = JobArraySerializer
    filterset_fields = ["queue__name"]
    ordering_fields = ["id", "submitted_at", "size"]
    search_fields = ["name"]

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        counts = (
            JobArray.objects.filter(pk__in=[a.pk for a in page]).values("pk").annotate(**_COUNTS).order_by()
        )
        by_array = {row.pop("pk"): row for row in counts}
        for array in page:
            array.counted = by_array.get(array.pk, dict.fromkeys(JobState.values, 0))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def _act(self, request, name: str):
        array = self.get_object()
        body = ArrayActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            changed = arrays.act(
                array,
                name,
                indices=body.validated_data.get("indices"),
                actor=request.user.username,
                reason=body.validated_data["reason"],
            )
        except SubmitError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        return Response({"changed": changed, "array": JobArraySerializer(array).data})

    @extend_schema(request=ArrayActionSerializer, responses=ArrayActionResultSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel the array's active jobs (or those of ``indices``) and release their GPUs."""
        return self._act(request, "cancel")

    @extend_schema(request=ArrayActionSerializer, responses=ArrayActionResultSerializer)
    @action(detail=True, methods=["post"])
    def hold(self, request, pk=None):
        """Hold the array's pending jobs (or those of ``indices``): none of them starts until
        released; its running jobs run on."""
        return self._act(request, "hold")

    @extend_schema(request=ArrayActionSerializer, responses=ArrayActionResultSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        """Put the array's held jobs (or those of ``indices``) back in its queue."""
        return self._act(request, "release")
