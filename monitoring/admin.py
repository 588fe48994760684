from django.contrib import admin

from monitoring.models import FaultEvent


@admin.register(FaultEvent)
class FaultEventAdmin(admin.ModelAdmin):
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
