from __future__ import annotations

from rest_framework import serializers

from cluster.api.serializers import NodeDrainSerializer
from engine.presets import PRESETS
from monitoring.faults.services import fault_problem
from monitoring.models import CongestionRecord, FaultEvent, Simulation
from monitoring.whatif.simreport import parse_config


class CongestionRecordSerializer(serializers.ModelSerializer):
    link = serializers.CharField(read_only=True)
    pod_name = serializers.CharField(source="pod.name", read_only=True)

    class Meta:
        model = CongestionRecord
        fields = [
            "id",
            "link",
            "pod",
            "pod_name",
            "rail",
            "started_at",
            "ended_at",
            "peak_p99",
            "peak_cnp_per_s",
            "peak_util",
            "jobs",
            "source",
        ]
        read_only_fields = fields


class FaultEventSerializer(serializers.ModelSerializer):
    hostname = serializers.SerializerMethodField()

    class Meta:
        model = FaultEvent
        fields = [
            "id",
            "node",
            "gpu",
            "pod",
            "link",
            "hostname",
            "at",
            "detected_at",
            "source",
            "xid",
            "severity",
            "cause",
            "description",
            "action",
            "actor",
            "job",
            "recovery_s",
            "cleared_at",
            "data",
        ]
        read_only_fields = [
            "detected_at",
            "cause",
            "action",
            "actor",
            "job",
            "recovery_s",
            "cleared_at",
            "data",
        ]
        extra_kwargs = {"at": {"required": False}}

    def get_hostname(self, fault: FaultEvent) -> str | None:
        node = fault.node or (fault.gpu.node if fault.gpu else None)
        return node.hostname if node else None

    def validate(self, attrs):
        problem = fault_problem(attrs)
        if problem:
            raise serializers.ValidationError(problem)
        return attrs


class SimulationSerializer(serializers.ModelSerializer):
    configurations = serializers.ListField(
        child=serializers.CharField(max_length=200), required=False, default=list, max_length=8
    )
    days = serializers.FloatField(min_value=0.01, max_value=90)
    elastic_share = serializers.FloatField(min_value=0, max_value=1, required=False, default=0.0)
    jobs = serializers.IntegerField(min_value=1, max_value=200_000, required=False, allow_null=True)
    report_url = serializers.SerializerMethodField()
    parts = serializers.SerializerMethodField()

    class Meta:
        model = Simulation
        fields = [
            "id",
            "name",
            "cluster",
            "days",
            "seed",
            "jobs",
            "elastic_share",
            "configurations",
            "state",
            "progress",
            "summary",
            "error",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "report_url",
            "parts",
        ]
        read_only_fields = fields[fields.index("state") :]

    def get_parts(self, sim) -> list[dict]:
        """Each configuration's task: its progress and the worker that runs or ran it."""
        return [
            {"index": p.index, "progress": p.progress, "worker": p.worker, "done": p.finished_at is not None}
            for p in sorted(sim.parts.all(), key=lambda p: p.index)
        ]

    def get_report_url(self, sim) -> str | None:
        return f"/api/v1/simulations/{sim.pk}/report/" if sim.state == Simulation.State.DONE else None

    def validate_cluster(self, value):

        if value not in PRESETS and value != "inventory":
            raise serializers.ValidationError(
                f"unknown cluster {value!r}; known: {', '.join(PRESETS)}, inventory"
            )
        return value

    def validate_configurations(self, value):

        for text in value:
            try:
                parse_config(text)
            except ValueError as exc:
                raise serializers.ValidationError(str(exc)) from exc
        return value


class DomainDrainSerializer(NodeDrainSerializer):
    within = serializers.CharField(max_length=40, help_text="node:ID, rack:ID or pod:ID")
    action = serializers.ChoiceField(choices=["drain", "mark-down"], default="drain")
    reason = serializers.CharField(max_length=200, help_text="Why: kept in the audit of every node it takes")
