"""A job's life as segments (pending, running, checkpointing, recovering, preempted, suspended),
derived from its events and checkpoints: what the job page draws as a timeline."""

from __future__ import annotations

from datetime import datetime, timedelta

from scheduling.choices import EventKind

# the state an event starts; events not listed (placed, planned, resized) keep the current one
_STARTS = {
    EventKind.SUBMITTED: "pending",
    EventKind.ADMITTED: "running",
    EventKind.RESUMED: "pending",
    EventKind.REQUEUED: "pending",
    EventKind.PREEMPTED: "preempted",
    EventKind.SUSPENDED: "suspended",
    EventKind.FAULTED: "recovering",
    EventKind.RECOVERED: "running",
}
_ENDS = {EventKind.FINISHED, EventKind.FAILED, EventKind.CANCELLED}


def segments(events, checkpoints, now: datetime) -> list[dict]:
    """events: [(at, kind)] in time order; checkpoints: [(at, stall_s)].
    Returns [{"state", "start", "end"}] covering submit to the end (or now); checkpoint stalls
    are cut out of running segments as "checkpointing"."""
    out: list[dict] = []
    state, since = None, None
    for at, kind in events:
        if kind in _ENDS:
            if state is not None:
                out.append({"state": state, "start": since, "end": at})
            state, since = None, None
            continue
        new = _STARTS.get(kind)
        if new is None or new == state:
            continue
        if state is not None and at > since:
            out.append({"state": state, "start": since, "end": at})
        state, since = new, at
    if state is not None:
        out.append({"state": state, "start": since, "end": max(now, since)})
    return _cut_stalls(out, checkpoints)


def _cut_stalls(segs: list[dict], checkpoints) -> list[dict]:
    """Split running segments around each checkpoint's stall (the save ends at the checkpoint's time)."""
    stalls = sorted((at - timedelta(seconds=s), at) for at, s in checkpoints if s > 0)
    if not stalls:
        return segs
    out = []
    for seg in segs:
        if seg["state"] != "running":
            out.append(seg)
            continue
        cursor = seg["start"]
        for s0, s1 in stalls:
            s0, s1 = max(s0, cursor), min(s1, seg["end"])
            if s1 <= s0:
                continue
            if s0 > cursor:
                out.append({"state": "running", "start": cursor, "end": s0})
            out.append({"state": "checkpointing", "start": s0, "end": s1})
            cursor = s1
        if seg["end"] > cursor:
            out.append({"state": "running", "start": cursor, "end": seg["end"]})
    return out
