"""The API's inference services, with their replicas and recent autoscaling changes."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import serializers

from engine.inference import LoadProfile, replica_topology
from scheduling.api.serializers import validate_chip_names
from scheduling.inference import replicas_of
from scheduling.models import InferenceService, Queue, ServiceScale
from scheduling.services import capacity_problem


class ServiceScaleSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServiceScale
        fields = ["at", "load_rps", "replicas_before", "replicas_after", "reason"]


class InferenceServiceSerializer(serializers.ModelSerializer):
    queue = serializers.SlugRelatedField(slug_field="name", queryset=Queue.objects.all())
    chip_types = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    load_profile = serializers.JSONField(
        help_text='{"kind": "diurnal", "trough_rps": 20, "peak_rps": 200, "peak_hour": 14, "burst": '
        '"azure-conv"} or {"kind": "points", "points": [[0, 10], [12, 80]]}'
    )
    replica_share = serializers.IntegerField(min_value=1, max_value=1000, required=False, default=1000)
    capacity_rps = serializers.FloatField(min_value=0.001)
    headroom = serializers.FloatField(min_value=0, max_value=10, required=False, default=0.2)
    scale_down_delay_s = serializers.FloatField(min_value=0, required=False, default=300.0)
    replicas = serializers.SerializerMethodField()
    load_now_rps = serializers.SerializerMethodField()
    recent_scales = serializers.SerializerMethodField()

    class Meta:
        model = InferenceService
        fields = [
            "id",
            *InferenceService.EDITABLE_FIELDS,
            "load_rps",
            "load_now_rps",
            "desired_replicas",
            "replicas",
            "recent_scales",
            "updated_at",
        ]
        read_only_fields = ["load_rps", "desired_replicas", "updated_at"]

    def get_replicas(self, service) -> dict:

        states = list(replicas_of(service).values_list("state", flat=True))
        return {"running": states.count("running"), "pending": states.count("pending")}

    def get_load_now_rps(self, service) -> float:
        return LoadProfile.from_dict(service.load_profile).rate(timezone.now().timestamp())

    def get_recent_scales(self, service) -> list[dict]:
        return ServiceScaleSerializer(service.scales.all()[:20], many=True).data

    def validate_load_profile(self, value):
        try:
            return LoadProfile.from_dict(value).as_dict()
        except ValueError as exc:
            raise serializers.ValidationError(str(exc).removeprefix("load_profile.")) from exc

    def validate_chip_types(self, chips):
        return validate_chip_names(chips)

    def validate(self, attrs):
        merged = {**({} if self.instance is None else self.instance.__dict__), **attrs}
        low, high = merged.get("min_replicas", 1), merged.get("max_replicas", 8)
        if low > high:
            raise serializers.ValidationError({"min_replicas": f"must be at most max_replicas ({high})"})
        if merged.get("replica_share", 1000) < 1000 and merged.get("replica_gpus", 1) != 1:
            raise serializers.ValidationError(
                {"replica_share": "a fraction of a GPU is for one-GPU replicas (replica_gpus 1)"}
            )
        gpus = merged.get("replica_gpus", 1)
        problem = capacity_problem(gpus, merged.get("chip_types") or [], replica_topology(gpus))
        if problem:
            raise serializers.ValidationError({"replica_gpus": problem[1]})
        return attrs
