from __future__ import annotations

from rest_framework import serializers

from engine.faults import SOURCE_TABLE
from monitoring.choices import FaultSource
from monitoring.models import FaultEvent


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
        targets = [k for k in ("node", "gpu", "pod", "link") if attrs.get(k) is not None]
        if not targets:
            raise serializers.ValidationError({"node": "name what failed: a node, a gpu, a pod or a link"})
        if len(targets) > 1:
            raise serializers.ValidationError(
                {targets[1]: f"name one thing that failed, not {' and '.join(targets)}"}
            )
        source = attrs.get("source")
        if source == FaultSource.XID and attrs.get("xid") is None:
            raise serializers.ValidationError({"xid": "an XID fault needs its code"})
        if source != FaultSource.XID and attrs.get("xid") is not None:
            raise serializers.ValidationError({"xid": f"only XID faults carry a code, not {source}"})
        if source == FaultSource.LINK_DOWN and not (
            attrs.get("link") or attrs.get("pod") or attrs.get("node")
        ):
            raise serializers.ValidationError(
                {"link": "a link fault names a datacenter link, a pod or a node"}
            )
        if source not in SOURCE_TABLE and source != FaultSource.XID:
            raise serializers.ValidationError({"source": f"unknown fault source {source}"})
        return attrs
