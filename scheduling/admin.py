from django import forms
from django.contrib import admin, messages
from django.db import models
from django.utils.html import format_html

from engine.inference import LoadProfile
from scheduling.choices import STATE_COLOURS
from scheduling.models import (
    QUEUE_SETTINGS,
    Checkpoint,
    CheckpointPolicy,
    Cohort,
    InferenceService,
    Job,
    JobEvent,
    Queue,
    QueueQuota,
    ServiceScale,
    WebhookDelivery,
)
from scheduling.services import JobStateError, change_state


@admin.register(CheckpointPolicy)
class CheckpointPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "interval_s", "triggered_success", "updated_at"]
    list_filter = ["kind"]
    search_fields = ["name"]


class CheckpointInline(admin.TabularInline):
    model = Checkpoint
    extra = 0
    can_delete = False
    readonly_fields = ["step", "at", "progress_s", "size_bytes", "kind", "durable", "stall_s"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Cohort)
class CohortAdmin(admin.ModelAdmin):
    list_display = ["name", "description"]
    search_fields = ["name"]


class QueueQuotaInline(admin.TabularInline):
    model = QueueQuota
    extra = 0


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = ["name", "cohort", *(f for f in QUEUE_SETTINGS if f not in ("description", "webhook_url"))]
    list_filter = ["cohort", "stopped"]
    search_fields = ["name"]
    inlines = [QueueQuotaInline]
    exclude = ["webhook_secret"]  # shown once, by POST /api/v1/queues/ID/webhook-secret/


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["kind", "at", "reason", "data"]

    def has_add_permission(self, request, obj=None):
        return False


def _job_action(name: str):
    def run(modeladmin, request, queryset):
        done, refused = 0, []
        for job in queryset:
            try:
                change_state(job.pk, name, actor=request.user.username)
                done += 1
            except JobStateError as exc:
                refused.append(f"{job}: {exc}")
        modeladmin.message_user(request, f"{name}: {done} job(s)")
        if refused:
            modeladmin.message_user(request, "; ".join(refused[:10]), level=messages.WARNING)

    run.__name__ = f"{name}_jobs"
    run.short_description = f"{name.capitalize()} selected jobs"
    return run


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = [
        "id",
        "name",
        "queue",
        "kind",
        "gpus",
        "priority",
        "state_label",
        "allocated_gpus",
        "chip",
        "placement",
        "pending_reason",
        "submitted_at",
    ]
    list_filter = ["state", "kind", "queue"]
    search_fields = ["name", "=id"]
    list_select_related = ["queue", "chip"]
    readonly_fields = [
        "state",
        "pending_reason",
        "submitted_at",
        "started_at",
        "finished_at",
        "chip",
        "placement",
        "progress_s",
        "preemptions",
        "allocated_gpus",
        "plan",
        "chip_ranking",
    ]
    raw_id_fields = ["owner", "service"]
    inlines = [JobEventInline, CheckpointInline]
    actions = [_job_action("cancel"), _job_action("suspend"), _job_action("resume")]
    show_full_result_count = False

    @admin.display(description="state", ordering="state")
    def state_label(self, obj):
        return format_html(
            '<span style="color:{}">&#9679;</span> {}',
            STATE_COLOURS.get(obj.state, "#999"),
            obj.get_state_display(),
        )


class ServiceScaleInline(admin.TabularInline):
    model = ServiceScale
    extra = 0
    can_delete = False
    readonly_fields = ["at", "load_rps", "replicas_before", "replicas_after", "reason"]

    def has_add_permission(self, request, obj=None):
        return False


class InferenceServiceForm(forms.ModelForm):
    class Meta:
        model = InferenceService
        fields = list(InferenceService.EDITABLE_FIELDS)

    def clean_load_profile(self):

        try:
            return LoadProfile.from_dict(self.cleaned_data["load_profile"]).as_dict()
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc


@admin.register(InferenceService)
class InferenceServiceAdmin(admin.ModelAdmin):
    """Operators set the load profile and the replica bounds; the autoscaler does the rest."""

    form = InferenceServiceForm
    list_display = [
        "name",
        "queue",
        "replica_gpus",
        "replica_share",
        "min_replicas",
        "max_replicas",
        "desired_replicas",
        "load_rps",
        "paused",
    ]
    list_filter = ["queue", "paused"]
    search_fields = ["name"]
    readonly_fields = ["load_rps", "desired_replicas", "low_since", "updated_at"]
    inlines = [ServiceScaleInline]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """What was posted where, and how it went (scheduling.webhooks); read only."""

    list_display = ["id", "job", "kind", "url", "state", "attempts", "last_status", "next_attempt_at"]
    list_filter = ["state", "kind"]
    search_fields = ["url", "job__name"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
