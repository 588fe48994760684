from __future__ import annotations

import django_filters as filters
from rest_framework import mixins, viewsets

from monitoring.api.serializers import FaultEventSerializer
from monitoring.choices import FaultSource
from monitoring.models import FaultEvent
from monitoring.services import report_fault


class FaultEventFilterSet(filters.FilterSet):
    source = filters.MultipleChoiceFilter(choices=FaultSource.choices)
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="at", lookup_expr="lte")
    open = filters.BooleanFilter(field_name="cleared_at", lookup_expr="isnull")
    hostname = filters.CharFilter(field_name="node__hostname")

    class Meta:
        model = FaultEvent
        fields = ["source", "xid", "node", "gpu", "pod", "link", "job", "since", "until", "open", "hostname"]


class FaultEventViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Faults as the controller saw them; operators may inject one (an XID on a GPU, a node down,
    a link down) to watch recovery happen."""

    queryset = FaultEvent.objects.select_related("node", "gpu__node").order_by("-at", "-id")
    serializer_class = FaultEventSerializer
    filterset_class = FaultEventFilterSet
    ordering_fields = ["at", "recovery_s"]

    def perform_create(self, serializer):
        serializer.instance = report_fault(
            data={"reported_by": self.request.user.username}, **serializer.validated_data
        )
