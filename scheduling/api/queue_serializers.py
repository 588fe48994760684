"""Queues, cohorts, quotas and checkpoint policies over the API; the webhook URL check jobs and
queues share."""

from __future__ import annotations

from django.db import transaction
from rest_framework import serializers

from cluster.models import ChipType
from scheduling.models import (
    QUEUE_SETTINGS,
    CheckpointPolicy,
    Cohort,
    Queue,
    QueueQuota,
)
from scheduling.usage import queue_usage
from scheduling.webhooks import WebhookURLError, check_url


class CheckpointPolicySerializer(serializers.ModelSerializer):
    class Meta:
        model = CheckpointPolicy
        fields = ["id", "name", "description", "kind", "interval_s", "triggered_success"]
        fields += ["recovery_tier", "replica_groups", "cordon_stragglers", "ettr_goal", "updated_at"]
        read_only_fields = ["updated_at"]
        extra_kwargs = {"replica_groups": {"min_value": 2, "max_value": 4096}}  # each holds the model

    def validate_interval_s(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("must be greater than zero, or empty for auto")
        return value

    def validate_triggered_success(self, value):
        if not 0 <= value <= 1:
            raise serializers.ValidationError("is a probability: between 0 and 1")
        return value

    def validate_ettr_goal(self, value):
        if not 0 <= value <= 1:
            raise serializers.ValidationError("is a ratio: between 0 and 1")
        return value


class CohortSerializer(serializers.ModelSerializer):
    queues = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)

    class Meta:
        model = Cohort
        fields = ["id", "name", "description", "queues"]


class QuotaSerializer(serializers.ModelSerializer):
    chip_type = serializers.SlugRelatedField(slug_field="name", queryset=ChipType.objects.all())

    class Meta:
        model = QueueQuota
        fields = ["chip_type", "nominal", "borrowing_limit", "lending_limit"]

    def validate(self, attrs):
        lending = attrs.get("lending_limit")
        if lending is not None and lending > attrs.get("nominal", 0):
            raise serializers.ValidationError({"lending_limit": "cannot be more than nominal"})
        return attrs


class UsageSerializer(serializers.Serializer):
    chip_type = serializers.CharField()
    nominal = serializers.IntegerField()
    borrowing_limit = serializers.IntegerField(allow_null=True)
    lending_limit = serializers.IntegerField(allow_null=True)
    used = serializers.FloatField(help_text="GPUs; jobs that share a GPU count their fraction")
    borrowed = serializers.FloatField()
    lent = serializers.FloatField()
    pending_demand = serializers.FloatField()


class QueueSerializer(serializers.ModelSerializer):
    cohort = serializers.SlugRelatedField(
        slug_field="name", queryset=Cohort.objects.all(), allow_null=True, required=False
    )
    quotas = QuotaSerializer(many=True, required=False)
    usage = serializers.SerializerMethodField()
    default_checkpoint_policy = serializers.SlugRelatedField(
        slug_field="name", queryset=CheckpointPolicy.objects.all(), allow_null=True, required=False
    )

    class Meta:
        model = Queue
        fields = [
            "id",
            "name",
            "cohort",
            *QUEUE_SETTINGS,
            "default_checkpoint_policy",
            "quotas",
            "usage",
            "updated_at",
        ]
        read_only_fields = ["updated_at"]

    def get_usage(self, queue: Queue) -> list[dict]:
        usage = self.context.get("usage")
        if usage is None:
            usage = self.context["usage"] = queue_usage()
        return UsageSerializer(usage.get(queue.name, []), many=True).data

    def validate_weight(self, value):
        if value <= 0:
            raise serializers.ValidationError("must be greater than zero")
        return value

    def validate_webhook_url(self, value):
        return validate_webhook_url(value)

    def validate_quotas(self, quotas):
        for i, q in enumerate(quotas):  # a partial update does not make nested fields required
            if "chip_type" not in q:
                raise serializers.ValidationError(f"quota {i}: chip_type is required")
        chips = [q["chip_type"].name for q in quotas]
        duplicates = sorted({c for c in chips if chips.count(c) > 1})
        if duplicates:
            raise serializers.ValidationError(f"chip type listed twice: {', '.join(duplicates)}")
        return quotas

    def _write_quotas(self, queue: Queue, quotas) -> None:
        queue.quotas.all().delete()
        QueueQuota.objects.bulk_create(QueueQuota(queue=queue, **q) for q in quotas)

    @transaction.atomic
    def create(self, validated_data):
        quotas = validated_data.pop("quotas", [])
        queue = super().create(validated_data)
        self._write_quotas(queue, quotas)
        return queue

    @transaction.atomic
    def update(self, instance, validated_data):
        quotas = validated_data.pop("quotas", None)
        queue = super().update(instance, validated_data)
        if quotas is not None:
            self._write_quotas(queue, quotas)
        return queue


def validate_webhook_url(url: str) -> str:
    """An http(s) URL whose host is public or in MYRIAD_WEBHOOK_ALLOW (scheduling.webhooks)."""
    if url:
        try:
            check_url(url)
        except WebhookURLError as exc:
            raise serializers.ValidationError(str(exc)) from exc
    return url
