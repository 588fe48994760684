"""Jobs over the API: submit, read with plan, events, checkpoints and expected start, act on them."""

from __future__ import annotations

import copy

from rest_framework import serializers

from cluster.snapshot import topology_cache
from engine.efficiency import COLUMNS as EFFICIENCY_COLUMNS
from engine.efficiency import summary as efficiency_summary
from engine.steptime import ModelSpec
from scheduling.api.queue_serializers import validate_webhook_url
from scheduling.checkpoints import recommendation
from scheduling.choices import STATE_COLOURS, JobKind, PendingKind, TopologyConstraint
from scheduling.ettr import job_ettr
from scheduling.forecast_models import expected_start
from scheduling.launch import env_problem
from scheduling.models import (
    Checkpoint,
    CheckpointPolicy,
    Job,
    JobEvent,
    Queue,
)


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["id", "step", "at", "progress_s", "size_bytes", "kind", "durable", "stall_s"]
        extra_kwargs = {"at": {"required": False}}

    def validate(self, attrs):
        for field in ("progress_s", "size_bytes", "stall_s"):
            if attrs.get(field, 0) < 0:
                raise serializers.ValidationError({field: "must not be negative"})
        return attrs


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["kind", "at", "reason", "data"]


def validate_chip_names(chips: list[str]) -> list[str]:
    """Chip types of the cluster, each listed once (jobs and inference services)."""
    known = set(topology_cache.structure().chip_names)
    unknown = [c for c in chips if c not in known]
    if unknown:
        raise serializers.ValidationError(
            f"unknown chip type {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    if len(set(chips)) != len(chips):
        raise serializers.ValidationError("a chip type is listed twice")
    return chips


class QueueNameField(serializers.SlugRelatedField):
    """A queue by name, read with one plain statement (the ORM builds the same SELECT anew on
    every submit, which costs more than running it)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        table = Queue._meta.db_table
        found = list(Queue.objects.raw(f"SELECT * FROM {table} WHERE name = %s", [data]))  # noqa: S608
        if not found:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return found[0]


def _shallow(field):
    """What ``copy.copy`` makes of a field (a new instance of its class holding the same attribute
    values), without the pickling protocol ``copy.copy`` goes through, which cost a submit 0.1 ms
    for its forty fields."""
    new = object.__new__(type(field))
    new.__dict__.update(field.__dict__)
    return new


class JobSerializer(serializers.ModelSerializer):
    queue = QueueNameField(slug_field="name", queryset=Queue.objects.all())
    chip_types = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    chip = serializers.CharField(source="chip.name", read_only=True, allow_null=True)
    priority = serializers.IntegerField(required=False)
    topology = serializers.ChoiceField(choices=TopologyConstraint.choices, default="datacenter")
    kind = serializers.ChoiceField(choices=JobKind.choices, default=JobKind.TRAINING)
    state_colour = serializers.SerializerMethodField()
    expected_start = serializers.SerializerMethodField(
        help_text="A pending job's expected start: p50, p90 (empty: beyond the horizon), when it was played"
    )
    pending_kind = serializers.ChoiceField(choices=PendingKind.choices, allow_blank=True, read_only=True)
    gpus = serializers.IntegerField(min_value=1, max_value=1_000_000)
    min_gpus = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    size_step = serializers.IntegerField(min_value=1, max_value=4096, required=False, default=1)
    share = serializers.IntegerField(
        min_value=1,
        max_value=1000,
        required=False,
        default=1000,
        help_text="Thousandths of one GPU; below 1000 the job shares a GPU (gpus must be 1)",
    )
    model = serializers.JSONField(required=False, default=dict)
    estimated_duration_s = serializers.FloatField(required=False, allow_null=True, min_value=1)
    parameters = serializers.FloatField(required=False, allow_null=True, min_value=1)
    checkpoint_policy = serializers.SlugRelatedField(
        slug_field="name", queryset=CheckpointPolicy.objects.all(), allow_null=True, required=False
    )
    command = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=8192,
        help_text="On real nodes: the command each node's agent starts once (sh -c), with the launch "
        "environment (MASTER_ADDR, WORLD_SIZE, NODE_RANK, CUDA_VISIBLE_DEVICES, ...)",
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=4096),
        required=False,
        default=dict,
        help_text="Extra environment variables for the command",
    )
    array = serializers.CharField(
        write_only=True,
        required=False,
        max_length=4096,
        help_text='Submit a job array: one job per index, e.g. "0-9999%500" (at most 500 running at once)',
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "queue",
            "kind",
            "priority",
            "gpus",
            "min_gpus",
            "size_step",
            "share",
            "mixed_chips",
            "allocated_gpus",
            "chip_types",
            "topology",
            "estimated_duration_s",
            "parameters",
            "model",
            "plan",
            "chip_ranking",
            "checkpoint_policy",
            "state",
            "state_colour",
            "pending_reason",
            "pending_kind",
            "expected_start",
            "submitted_at",
            "started_at",
            "finished_at",
            "chip",
            "placement",
            "progress_s",
            "preemptions",
            "command",
            "env",
            "launched_generation",
            "start_failures",
            "requeue_at",
            "webhook_url",
            "array",
            "array_id",
            "array_index",
        ]
        read_only_fields = [
            "launched_generation",
            "start_failures",
            "requeue_at",
            "state",
            "pending_reason",
            "pending_kind",
            "submitted_at",
            "started_at",
            "finished_at",
            "placement",
            "progress_s",
            "preemptions",
            "allocated_gpus",
            "plan",
            "chip_ranking",
            "array_id",
            "array_index",
        ]
        # (array, array_index) is unique, but arrays are numbered by the server, never by a body
        validators: list = []

    def validate_webhook_url(self, value):
        return validate_webhook_url(value)

    def get_state_colour(self, job: Job) -> str:
        return STATE_COLOURS.get(job.state, "#999999")

    def get_expected_start(self, job: Job) -> dict | None:
        return expected_start(job)

    _field_cache: dict = {}

    def get_fields(self):
        # Building a ModelSerializer's fields by introspection costs milliseconds per request; the
        # submit path is hot (pipelines submit thousands of jobs), so build them once per class.
        # Each request binds its own copies (bind() sets the field's name, parent and source); a
        # shallow copy is enough for plain fields, whose per-request state bind() replaces, and
        # costs a tenth of DRF's deep copy. Nested serializers are copied deeply.
        cls = type(self)
        cached = JobSerializer._field_cache.get(cls)
        if cached is None:
            cached = JobSerializer._field_cache[cls] = super().get_fields()
        return {
            name: copy.deepcopy(field) if isinstance(field, serializers.BaseSerializer) else _shallow(field)
            for name, field in cached.items()
        }

    def validate_chip_types(self, chips):
        return validate_chip_names(chips)

    def validate_env(self, env):
        problem = env_problem(env)
        if problem:
            raise serializers.ValidationError(problem)
        return env

    def validate(self, attrs):
        if attrs.get("env") and not attrs.get("command"):
            raise serializers.ValidationError({"env": ["an environment needs a command to run"]})
        return attrs

    def validate_model(self, model):
        if not model:
            return {}
        try:
            return ModelSpec.from_dict(model).as_dict()
        except (ValueError, TypeError) as exc:
            raise serializers.ValidationError(str(exc).removeprefix("model.")) from exc


class JobDetailSerializer(JobSerializer):
    events = JobEventSerializer(many=True, read_only=True)
    gpu_ids = serializers.SerializerMethodField()
    ettr = serializers.SerializerMethodField()
    checkpoint_recommendation = serializers.SerializerMethodField()
    recent_checkpoints = serializers.SerializerMethodField()
    size_history = serializers.SerializerMethodField()
    processes = serializers.SerializerMethodField()
    efficiency = serializers.SerializerMethodField()
    webhooks = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "checkpoint_requested_at",
            "processes",
            "size_history",
            "events",
            "gpu_ids",
            "ettr",
            "checkpoint_recommendation",
            "recent_checkpoints",
            "efficiency",
            "webhooks",
        ]

    def get_webhooks(self, job: Job) -> list[dict]:
        """Its last 20 webhook deliveries: what, where, how they went."""
        fields = ("id", "kind", "url", "state", "attempts", "last_status", "last_error", "next_attempt_at")
        return list(job.webhooks.order_by("-id").values(*fields, "delivered_at")[:20])

    def get_efficiency(self, job: Job) -> dict | None:
        """Its use of the GPUs it held, from the telemetry frames (written about once a minute;
        the efficiency page and /api/v1/efficiency/ add the GPUs idle now)."""
        row = getattr(job, "efficiency", None)
        if row is None:
            return None
        figures = efficiency_summary([getattr(row, c) for c in EFFICIENCY_COLUMNS])
        return {**figures, "updated_at": row.updated_at}

    def get_ettr(self, job: Job) -> dict | None:

        return job_ettr([job]).get(job.pk)

    def get_checkpoint_recommendation(self, job: Job) -> dict:

        return recommendation(job)

    def get_processes(self, job: Job) -> list[dict]:
        """Its launcher processes on real nodes, newest placement first, with their log tails."""
        rows = job.processes.select_related("node").order_by("-updated_at", "rank")[:64]
        return [
            {
                "node": p.node.hostname,
                "rank": p.rank,
                "generation": p.generation,
                "state": p.state,
                "pid": p.pid,
                "exit_code": p.exit_code,
                "started_at": p.started_at,
                "ended_at": p.ended_at,
                "log_tail": p.log_tail,
            }
            for p in rows
        ]

    def get_recent_checkpoints(self, job: Job) -> list[dict]:
        return CheckpointSerializer(job.checkpoints.all()[:20], many=True).data

    def get_size_history(self, job: Job) -> list[dict]:
        """Every admission and resize: when, how many GPUs, the plan and its modelled throughput."""
        history = []
        for e in job.events.filter(kind__in=["admitted", "planned", "resized"]).order_by("at", "id"):
            if e.kind == "admitted":
                history.append({"at": e.at, "gpus": e.data.get("gpus"), "reason": e.reason, "plan": None})
            elif e.kind == "planned" and history:
                history[-1]["plan"] = e.data.get("plan")
            elif e.kind == "resized":
                history.append(
                    {
                        "at": e.at,
                        "gpus": e.data.get("new_gpus"),
                        "reason": e.reason,
                        "plan": e.data.get("new_plan"),
                        "throughput_ratio": e.data.get("throughput_ratio"),
                    }
                )
        return history

    def get_gpu_ids(self, job: Job) -> list[int]:
        return list(job.gpus_held.filter(active=True).order_by("gpu_id").values_list("gpu_id", flat=True))


class JobActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class ETTRQuerySerializer(serializers.Serializer):
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)
    queue = serializers.CharField(required=False)


class ETTRSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    jobs = serializers.IntegerField()
    gpu_seconds = serializers.FloatField()
    ettr = serializers.FloatField(allow_null=True)
    loss_share = serializers.DictField(child=serializers.FloatField())
