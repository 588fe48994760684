from __future__ import annotations

from django.db import transaction
from rest_framework import serializers

from cluster.builder import gpu_identity
from cluster.choices import colour
from cluster.models import (
    GPU,
    ChipType,
    Datacenter,
    EnrolmentToken,
    Node,
    NodeCredential,
    Pod,
    Rack,
    Region,
)
from cluster.services import set_spare


class ChipTypeSerializer(serializers.ModelSerializer):
    price_per_gpu_hour = serializers.DecimalField(max_digits=8, decimal_places=3, coerce_to_string=False)
    charge_per_gpu_hour = serializers.DecimalField(
        max_digits=8, decimal_places=3, coerce_to_string=False, allow_null=True, required=False
    )

    class Meta:
        model = ChipType
        fields = [
            "id",
            "name",
            "vendor",
            "model",
            "generation",
            "bf16_tflops",
            "memory_gib",
            "memory_bandwidth_tbps",
            "link_bandwidth_gbps",
            "tdp_watts",
            "price_per_gpu_hour",
            "charge_per_gpu_hour",
            "failure_rate_factor",
        ]

    def validate(self, attrs):
        for field in ("bf16_tflops", "memory_gib", "failure_rate_factor"):
            if field in attrs and attrs[field] <= 0:
                raise serializers.ValidationError({field: "must be greater than zero"})
        for field in ("price_per_gpu_hour", "charge_per_gpu_hour"):
            if (attrs.get(field) or 0) < 0:
                raise serializers.ValidationError({field: "must not be negative"})
        return attrs


class CountField(serializers.IntegerField):
    """A count the list query annotates: 0 where nothing is counted, and on the answer to a create
    or update (whose object was not read through the annotated query)."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, **kwargs)

    def get_attribute(self, instance):
        return getattr(instance, self.source, None) or 0


class RegionSerializer(serializers.ModelSerializer):
    datacenter_count = CountField()
    gpu_count = CountField()

    class Meta:
        model = Region
        fields = ["id", "name", "description", "datacenter_count", "gpu_count"]


class DatacenterSerializer(serializers.ModelSerializer):
    region_name = serializers.CharField(source="region.name", read_only=True)
    pod_count = CountField()
    gpu_count = CountField()

    class Meta:
        model = Datacenter
        fields = [
            "id",
            "region",
            "region_name",
            "name",
            "location",
            "power_budget_kw",
            "pod_count",
            "gpu_count",
        ]

    def validate_power_budget_kw(self, value):
        if value < 0:
            raise serializers.ValidationError("must not be negative")
        return value


class PodSerializer(serializers.ModelSerializer):
    datacenter_name = serializers.CharField(source="datacenter.name", read_only=True)
    rack_count = CountField()
    node_count = CountField()
    gpu_count = CountField()

    class Meta:
        model = Pod
        fields = [
            "id",
            "datacenter",
            "datacenter_name",
            "name",
            "fabric",
            "rack_count",
            "node_count",
            "gpu_count",
        ]


class RackSerializer(serializers.ModelSerializer):
    node_count = CountField()
    gpu_count = CountField()

    class Meta:
        model = Rack
        fields = ["id", "pod", "name", "node_count", "gpu_count"]


class NodeSerializer(serializers.ModelSerializer):
    chip_type = serializers.SlugRelatedField(slug_field="name", queryset=ChipType.objects.all())
    state_colour = serializers.SerializerMethodField()
    pod = serializers.IntegerField(source="rack.pod_id", read_only=True)
    datacenter = serializers.IntegerField(source="rack.pod.datacenter_id", read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "hostname",
            "rack",
            "pod",
            "datacenter",
            "chip_type",
            "gpus_per_node",
            "state",
            "state_colour",
            "state_reason",
            "state_changed_at",
            "drain_deadline",
            "is_spare",
            "is_lemon",
        ]
        read_only_fields = ["state", "state_reason", "state_changed_at", "drain_deadline", "is_lemon"]

    def get_state_colour(self, node: Node) -> str:
        return colour(node.state)

    @transaction.atomic
    def update(self, instance, validated_data):
        spare = validated_data.pop("is_spare", None)
        node = super().update(instance, validated_data)
        if spare is not None and spare != node.is_spare:
            request = self.context.get("request")
            set_spare([node], spare, actor=request.user.username if request else "api")
            node.refresh_from_db()
        return node

    def validate_gpus_per_node(self, value):
        if not 1 <= value <= 72:
            raise serializers.ValidationError("must be between 1 and 72")
        if self.instance is not None and value != self.instance.gpus_per_node:
            raise serializers.ValidationError("cannot change on an existing node; its GPUs are inventory")
        return value

    @transaction.atomic
    def create(self, validated_data):
        node = super().create(validated_data)
        gpus = []
        for index in range(node.gpus_per_node):
            gpu_uuid, serial = gpu_identity(node.hostname, index)
            gpus.append(GPU(node=node, index=index, uuid=gpu_uuid, serial=serial))
        GPU.objects.bulk_create(gpus)
        return node


class NodeActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


MAX_DRAIN_GRACE_S = 30 * 86_400


class NodeDrainSerializer(NodeActionSerializer):
    grace_s = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_DRAIN_GRACE_S,
        default=0,
        help_text="Seconds running work may keep running before it is checkpointed and moved (0: at once)",
    )


class GPUSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)
    chip_type = serializers.CharField(source="node.chip_type.name", read_only=True)
    state_colour = serializers.SerializerMethodField()
    health_colour = serializers.SerializerMethodField()

    class Meta:
        model = GPU
        fields = [
            "id",
            "node",
            "hostname",
            "chip_type",
            "index",
            "uuid",
            "serial",
            "state",
            "state_colour",
            "health",
            "health_colour",
        ]
        read_only_fields = ["node", "index", "uuid", "serial"]

    def get_state_colour(self, gpu: GPU) -> str:
        return colour(gpu.state)

    def get_health_colour(self, gpu: GPU) -> str:
        return colour(gpu.health)


class EnrolmentTokenSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(
        slug_field="hostname",
        queryset=Node.objects.all(),
        required=False,
        allow_null=True,
        help_text="The node it enrols; empty: the node named by the agent's hostname",
    )
    ttl_s = serializers.IntegerField(
        write_only=True,
        required=False,
        default=24 * 3600,
        min_value=60,
        max_value=30 * 24 * 3600,
        help_text="Seconds until it expires",
    )
    used_for = serializers.CharField(source="used_for.hostname", read_only=True, allow_null=True)

    class Meta:
        model = EnrolmentToken
        fields = [
            "id",
            "prefix",
            "node",
            "ttl_s",
            "created_by",
            "created_at",
            "expires_at",
            "used_at",
            "used_for",
        ]
        read_only_fields = ["prefix", "created_by", "created_at", "expires_at", "used_at"]


class NodeCredentialSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.hostname", read_only=True)

    class Meta:
        model = NodeCredential
        fields = [
            "id",
            "node",
            "prefix",
            "address",
            "agent_version",
            "created_at",
            "last_used_at",
            "last_seq",
            "reports_accepted",
            "heartbeat_lost_at",
            "revoked_at",
            "revoked_by",
        ]
        read_only_fields = fields
