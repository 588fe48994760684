import django_filters as filters

from scheduling.choices import JobKind, JobState
from scheduling.models import Job, Queue


class JobFilterSet(filters.FilterSet):
    queue = filters.CharFilter(field_name="queue__name")
    state = filters.MultipleChoiceFilter(choices=JobState.choices)
    kind = filters.MultipleChoiceFilter(choices=JobKind.choices)
    min_gpus = filters.NumberFilter(field_name="gpus", lookup_expr="gte")
    max_gpus = filters.NumberFilter(field_name="gpus", lookup_expr="lte")
    array = filters.NumberFilter(field_name="array_id")
    array_index = filters.NumberFilter(field_name="array_index")

    class Meta:
        model = Job
        fields = ["queue", "state", "kind", "min_gpus", "max_gpus", "array", "array_index"]


class QueueFilterSet(filters.FilterSet):
    cohort = filters.CharFilter(field_name="cohort__name")

    class Meta:
        model = Queue
        fields = ["name", "cohort", "stopped"]
