from django import forms
from django.contrib import admin
from django.db import transaction
from django.utils import timezone

from monitoring.faults.services import fault_problem
from monitoring.models import CongestionRecord, FaultEvent, Simulation, SitePartition
from monitoring.tasks import handle_fault_task


class FaultEventForm(forms.ModelForm):
    class Meta:
        model = FaultEvent
        fields = ["node", "gpu", "pod", "link", "at", "source", "xid", "severity", "description"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["at"].required = False

    def clean(self):
        data = super().clean()
        problem = fault_problem(data)
        if problem:
            raise forms.ValidationError(problem)
        return data


@admin.register(FaultEvent)
class FaultEventAdmin(admin.ModelAdmin):
    """Faults as the controller saw them. Adding one injects it: it is handled exactly like a
    node agent's report (classified, hardware taken out of service, jobs recovered)."""

    form = FaultEventForm
    list_display = [
        "at",
        "__str__",
        "source",
        "xid",
        "severity",
        "cause",
        "action",
        "actor",
        "job",
        "recovery_s",
        "cleared_at",
    ]
    list_filter = ["source", "severity", "action", "cause", "node__rack__pod__datacenter"]
    search_fields = ["node__hostname", "gpu__node__hostname", "gpu__uuid", "description"]
    raw_id_fields = ["node", "gpu", "pod", "link", "job"]
    readonly_fields = ["detected_at", "cause", "action", "actor", "recovery_s", "data"]
    date_hierarchy = "at"
    show_full_result_count = False

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        obj.at = obj.at or timezone.now()
        obj.data = {**(obj.data or {}), "reported_by": request.user.username}
        super().save_model(request, obj, form, change)

        def enqueue() -> None:

            handle_fault_task.delay(obj.pk)

        transaction.on_commit(enqueue)


@admin.register(CongestionRecord)
class CongestionRecordAdmin(admin.ModelAdmin):
    """Fabric links that stayed congested (opened and closed by the telemetry, read only)."""

    list_display = ["__str__", "ended_at", "peak_p99", "peak_cnp_per_s", "peak_util", "source"]
    list_filter = ["source", "pod__datacenter"]
    date_hierarchy = "started_at"
    list_select_related = ["pod"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(SitePartition)
class SitePartitionAdmin(admin.ModelAdmin):
    """Datacenters the control plane could not reach (opened by the agents' silence or through the
    API; read only here)."""

    list_display = ["__str__", "detected_at", "ended_at", "source", "nodes", "reason"]
    list_filter = ["source", "datacenter"]
    date_hierarchy = "started_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Simulation)
class SimulationAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "cluster", "days", "seed", "state", "progress", "created_by", "created_at"]
    list_filter = ["state", "cluster"]
    readonly_fields = ["state", "progress", "summary", "error", "created_by", "started_at", "finished_at"]
