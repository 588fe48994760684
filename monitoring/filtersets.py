"""API filters of monitoring."""

from __future__ import annotations

import django_filters as filters

from monitoring.choices import FaultSource
from monitoring.models import CongestionRecord, FaultEvent


class CongestionRecordFilterSet(filters.FilterSet):
    open = filters.BooleanFilter(field_name="ended_at", lookup_expr="isnull")
    since = filters.IsoDateTimeFilter(field_name="started_at", lookup_expr="gte")

    class Meta:
        model = CongestionRecord
        fields = ["pod", "rail", "open", "since", "source"]


class FaultEventFilterSet(filters.FilterSet):
    source = filters.MultipleChoiceFilter(choices=FaultSource.choices)
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="at", lookup_expr="lte")
    open = filters.BooleanFilter(field_name="cleared_at", lookup_expr="isnull")
    hostname = filters.CharFilter(field_name="node__hostname")

    class Meta:
        model = FaultEvent
        fields = ["source", "xid", "node", "gpu", "pod", "link", "job", "since", "until", "open", "hostname"]
