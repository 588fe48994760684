"""Page forms of scheduling: what an operator posts, read into the fields the services take.
Validation itself is the API's (the serializers), so a page and the API refuse the same input with
the same messages."""

from __future__ import annotations

from django import forms

from engine.lifecycle import OPERATOR_JOB_ACTIONS

# the settings every edit form posts; the rest are read only when the form shows them
POSTED_SETTINGS = ("description", "priority", "weight", "reclaim_within_cohort", "within_queue")


class JobActionForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in OPERATOR_JOB_ACTIONS])
    reason = forms.CharField(max_length=200, required=False)


def queue_payload(post) -> dict:
    """The queue edit page's POST as the queue serializer's data: settings, quota rows, stopped.
    Fields a form leaves out stay as they are (``partial`` update)."""
    quotas = []
    for i in range(int(post.get("quota_rows", "0") or 0)):
        chip = post.get(f"quota-{i}-chip_type", "").strip()
        if not chip:
            continue
        quota = {"chip_type": chip}
        for f in ("nominal", "borrowing_limit", "lending_limit"):
            value = post.get(f"quota-{i}-{f}", "").strip()
            quota[f] = value if value != "" else (0 if f == "nominal" else None)
        quotas.append(quota)
    payload = {f: post.get(f, "") for f in POSTED_SETTINGS}
    payload.update(stopped=post.get("stopped") == "on", quotas=quotas)
    if "may_use_spares_shown" in post:  # a checkbox posts nothing when cleared
        payload["may_use_spares"] = post.get("may_use_spares") == "on"
    if "queueing_strategy" in post:
        payload["queueing_strategy"] = post["queueing_strategy"]
    if "borrow_preempt_max_priority" in post:
        payload["borrow_preempt_max_priority"] = post["borrow_preempt_max_priority"].strip() or None
    if "head_wait_s" in post:
        payload["head_wait_s"] = post["head_wait_s"].strip() or None
    if "webhook_url" in post:
        payload["webhook_url"] = post["webhook_url"].strip()
    return payload
