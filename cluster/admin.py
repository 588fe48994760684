"""Admin for the inventory, usable at 100k GPUs: counts come from annotations per page, foreign
keys use raw id widgets (no 100k-option selects), and no list ever loads every GPU."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, Sum
from django.utils.html import format_html

from cluster.agents import create_enrolment_token, revoke
from cluster.choices import colour
from cluster.models import (
    GPU,
    AuditRecord,
    ChipType,
    Datacenter,
    DatacenterLink,
    EnrolmentToken,
    NicPort,
    Node,
    NodeCredential,
    Pod,
    Rack,
    Region,
)
from cluster.services import apply_node_action, set_spare
from engine.states import InvalidTransition


def state_badge(value: str, label: str):
    # Colour plus the word itself: state is never shown by colour alone.
    return format_html('<span style="color:{}">&#9679;</span> {}', colour(value), label)


@admin.register(ChipType)
class ChipTypeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "vendor",
        "generation",
        "bf16_tflops",
        "memory_gib",
        "price_per_gpu_hour",
        "failure_rate_factor",
        "node_count",
    ]
    list_filter = ["vendor", "generation"]
    search_fields = ["name", "model"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_nodes=Count("nodes"))

    @admin.display(description="nodes", ordering="_nodes")
    def node_count(self, obj):
        return obj._nodes


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    list_display = ["name", "datacenter_count", "gpu_count"]
    search_fields = ["name"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                _dcs=Count("datacenters", distinct=True),
                _gpus=Sum("datacenters__pods__racks__nodes__gpus_per_node"),
            )
        )

    @admin.display(description="datacenters", ordering="_dcs")
    def datacenter_count(self, obj):
        return obj._dcs

    @admin.display(description="GPUs", ordering="_gpus")
    def gpu_count(self, obj):
        return obj._gpus or 0


@admin.register(Datacenter)
class DatacenterAdmin(admin.ModelAdmin):
    list_display = ["name", "region", "location", "power_budget_kw", "pod_count", "gpu_count"]
    list_filter = ["region"]
    search_fields = ["name", "location"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .select_related("region")
            .annotate(_pods=Count("pods", distinct=True), _gpus=Sum("pods__racks__nodes__gpus_per_node"))
        )

    @admin.display(description="pods", ordering="_pods")
    def pod_count(self, obj):
        return obj._pods

    @admin.display(description="GPUs", ordering="_gpus")
    def gpu_count(self, obj):
        return obj._gpus or 0


@admin.register(DatacenterLink)
class DatacenterLinkAdmin(admin.ModelAdmin):
    list_display = ["__str__", "distance_km", "latency_ms", "lanes", "lane_gbps", "lanes_lost", "state"]
    readonly_fields = ["state_changed_at"]


@admin.register(Pod)
class PodAdmin(admin.ModelAdmin):
    list_display = ["__str__", "datacenter", "fabric", "rack_count", "node_count", "gpu_count"]
    list_filter = ["datacenter", "fabric"]
    search_fields = ["name", "datacenter__name"]
    list_select_related = ["datacenter"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                _racks=Count("racks", distinct=True),
                _nodes=Count("racks__nodes", distinct=True),
                _gpus=Sum("racks__nodes__gpus_per_node"),
            )
        )

    @admin.display(description="racks", ordering="_racks")
    def rack_count(self, obj):
        return obj._racks

    @admin.display(description="nodes", ordering="_nodes")
    def node_count(self, obj):
        return obj._nodes

    @admin.display(description="GPUs", ordering="_gpus")
    def gpu_count(self, obj):
        return obj._gpus or 0


@admin.register(Rack)
class RackAdmin(admin.ModelAdmin):
    list_display = ["name", "pod", "node_count", "gpu_count"]
    list_filter = ["pod__datacenter"]
    search_fields = ["name", "pod__name", "pod__datacenter__name"]
    list_select_related = ["pod__datacenter"]
    raw_id_fields = ["pod"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(_nodes=Count("nodes", distinct=True), _gpus=Sum("nodes__gpus_per_node"))
        )

    @admin.display(description="nodes", ordering="_nodes")
    def node_count(self, obj):
        return obj._nodes

    @admin.display(description="GPUs", ordering="_gpus")
    def gpu_count(self, obj):
        return obj._gpus or 0


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ["index", "uuid", "serial", "state", "health"]
    readonly_fields = ["uuid", "serial"]


def _node_action(action: str):
    def run(modeladmin, request, queryset):
        try:
            nodes = apply_node_action(
                list(queryset), action, actor=request.user.username, reason="admin bulk action"
            )
        except InvalidTransition as exc:
            modeladmin.message_user(request, f"Nothing changed. {exc}", level=messages.ERROR)
            return
        modeladmin.message_user(request, f"{action}: {len(nodes)} node(s)", level=messages.SUCCESS)

    run.__name__ = f"{action}_nodes"
    run.short_description = f"{action.capitalize()} selected nodes"
    return run


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "hostname",
        "rack",
        "chip_type",
        "gpus_per_node",
        "state_label",
        "is_spare",
        "state_reason",
    ]
    list_filter = ["state", "is_spare", "chip_type", "rack__pod__datacenter"]
    search_fields = ["hostname"]
    list_select_related = ["rack", "chip_type"]
    raw_id_fields = ["rack"]
    readonly_fields = ["state", "state_reason", "state_changed_at"]
    inlines = [GPUInline]
    actions = [
        _node_action("cordon"),
        _node_action("uncordon"),
        _node_action("drain"),
        "mark_spare",
        "unmark_spare",
    ]
    show_full_result_count = False

    @admin.display(description="state", ordering="state")
    def state_label(self, obj):
        return state_badge(obj.state, obj.get_state_display())

    @admin.action(description="Mark selected nodes as spare")
    def mark_spare(self, request, queryset):
        self.message_user(
            request, f"{set_spare(queryset, True, actor=request.user.username)} node(s) marked as spare"
        )

    @admin.action(description="Return selected spare nodes to the general pool")
    def unmark_spare(self, request, queryset):
        self.message_user(
            request, f"{set_spare(queryset, False, actor=request.user.username)} node(s) no longer spare"
        )


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ["__str__", "uuid", "serial", "state_label", "health_label"]
    list_filter = ["state", "health", "node__chip_type", "node__rack__pod__datacenter"]
    search_fields = ["uuid", "serial", "node__hostname"]
    list_select_related = ["node"]
    raw_id_fields = ["node"]
    show_full_result_count = False
    list_per_page = 100

    @admin.display(description="state", ordering="state")
    def state_label(self, obj):
        return state_badge(obj.state, obj.get_state_display())

    @admin.display(description="health", ordering="health")
    def health_label(self, obj):
        return state_badge(obj.health, obj.get_health_display())


@admin.register(NicPort)
class NicPortAdmin(admin.ModelAdmin):
    """Nodes' network ports as their agents report them (read only: the agent keeps them)."""

    list_display = ["__str__", "kind", "rail", "rate_gbps"]
    list_filter = ["kind", "rail", "node__rack__pod__datacenter"]
    search_fields = ["name", "node__hostname"]
    list_select_related = ["node"]
    show_full_result_count = False
    list_per_page = 100

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    """Who changed what: read only, written by the pages, the API and node actions."""

    list_display = ["at", "actor", "action", "object_type", "object_name", "changes", "reason"]
    list_filter = ["object_type", "action"]
    search_fields = ["actor", "object_name", "reason"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(EnrolmentToken)
class EnrolmentTokenAdmin(admin.ModelAdmin):
    """Make a token with "Add": it is shown once, in the message after saving."""

    list_display = ["prefix", "node", "created_by", "created_at", "expires_at", "used_at", "used_for"]
    list_filter = ["used_at"]
    raw_id_fields = ["node"]
    fields = ["node"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change):
        token, secret = create_enrolment_token(actor=request.user.username, node=obj.node)
        obj.pk = token.pk
        messages.warning(request, f"Enrolment token (shown only now, valid for one use): {secret}")


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    """Node agents' credentials, stored hashed, with their last use; revoke to refuse a node at once."""

    list_display = ["node", "prefix", "address", "agent_version", "last_used_at", "last_seq", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["node__hostname", "prefix"]
    readonly_fields = [f.name for f in NodeCredential._meta.fields if f.name != "id"]
    exclude = ["key_hash"]
    actions = ["revoke_selected"]

    def has_add_permission(self, request) -> bool:
        return False  # credentials come from enrolment only

    @admin.action(description="Revoke the selected credentials")
    def revoke_selected(self, request, queryset):
        for credential in queryset.select_related("node"):
            revoke(credential, actor=request.user.username, reason="revoked in the admin")
        messages.success(request, f"{queryset.count()} credentials revoked")
