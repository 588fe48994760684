from __future__ import annotations

import django_filters as filters

from cluster.choices import GPUHealth, GPUState, NodeState
from cluster.models import GPU, ChipType, Datacenter, DatacenterLink, Node, Pod, Rack, Region


class ChipTypeFilterSet(filters.FilterSet):
    class Meta:
        model = ChipType
        fields = ["vendor", "generation", "name"]


class RegionFilterSet(filters.FilterSet):
    class Meta:
        model = Region
        fields = ["name"]


class DatacenterFilterSet(filters.FilterSet):
    region_name = filters.CharFilter(field_name="region__name")

    class Meta:
        model = Datacenter
        fields = ["region", "name"]


class DatacenterLinkFilterSet(filters.FilterSet):
    datacenter = filters.NumberFilter(method="filter_datacenter")

    class Meta:
        model = DatacenterLink
        fields = ["a", "b"]

    def filter_datacenter(self, queryset, name, value):
        return queryset.filter(a_id=value) | queryset.filter(b_id=value)


class PodFilterSet(filters.FilterSet):
    region = filters.NumberFilter(field_name="datacenter__region")

    class Meta:
        model = Pod
        fields = ["datacenter", "fabric", "name"]


class RackFilterSet(filters.FilterSet):
    datacenter = filters.NumberFilter(field_name="pod__datacenter")

    class Meta:
        model = Rack
        fields = ["pod", "name"]


class NodeFilterSet(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=NodeState.choices)
    chip_type = filters.CharFilter(field_name="chip_type__name")
    pod = filters.NumberFilter(field_name="rack__pod")
    datacenter = filters.NumberFilter(field_name="rack__pod__datacenter")
    region = filters.NumberFilter(field_name="rack__pod__datacenter__region")

    class Meta:
        model = Node
        fields = ["state", "is_spare", "chip_type", "rack", "pod", "datacenter", "region", "hostname"]


class GPUFilterSet(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=GPUState.choices)
    health = filters.MultipleChoiceFilter(choices=GPUHealth.choices)
    chip_type = filters.CharFilter(field_name="node__chip_type__name")
    hostname = filters.CharFilter(field_name="node__hostname")
    rack = filters.NumberFilter(field_name="node__rack")
    pod = filters.NumberFilter(field_name="node__rack__pod")
    datacenter = filters.NumberFilter(field_name="node__rack__pod__datacenter")

    class Meta:
        model = GPU
        fields = [
            "state",
            "health",
            "node",
            "chip_type",
            "hostname",
            "rack",
            "pod",
            "datacenter",
            "uuid",
            "serial",
        ]
