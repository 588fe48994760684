"""The datacenter links as the scheduler sees them: capacity now, and the share of each that the
running jobs crossing it took when they were placed (``Job.link_loads``). The rules are
engine.sites'; this module reads the inventory and the jobs into its terms and back."""

from __future__ import annotations

from django.conf import settings

from cluster.models import DatacenterLink
from engine.scheduler import SchedulerConfig
from engine.sites import SiteLink, SiteLinks, ring
from scheduling.choices import JobState
from scheduling.models import Job


def config(**kw) -> SchedulerConfig:
    """The scheduler's configuration from settings (the start limit, the span policy)."""
    return SchedulerConfig(
        max_start_gpus=settings.CYCLE_MAX_START_GPUS or None,
        span_policy=settings.SPAN_POLICY,
        span_margin=settings.SPAN_MARGIN,
        **kw,
    )


def running_loads(exclude: int | None = None) -> dict[tuple[int, int], float]:
    """Bytes per second the running jobs take on each link, by (datacenter id, datacenter id)."""
    loads: dict[tuple[int, int], float] = {}
    rows = Job.objects.filter(state=JobState.RUNNING, link_loads__isnull=False)
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    rows = rows.values_list("link_loads", flat=True)
    for entries in rows:
        for a, b, load in entries or ():
            pair = (min(a, b), max(a, b))
            loads[pair] = loads.get(pair, 0.0) + float(load)
    return loads


def room_for(job_id: int | None, dc_ids: list[int]) -> tuple[float, float] | None:
    """(bytes/s, one-way latency s) the slowest link among ``dc_ids`` leaves a job, the other
    running jobs' shares taken out (None: a link is missing or down). Never below 5% of the link:
    a job on it gets at least that much however many others joined."""
    ring_pairs = ring(tuple(sorted(dc_ids)))
    links = {(k.a_id, k.b_id): k for k in DatacenterLink.objects.filter(a_id__in=dc_ids, b_id__in=dc_ids)}
    if not ring_pairs or any(p not in links or links[p].state == "down" for p in ring_pairs):
        return None
    others = running_loads(exclude=job_id)
    room = []
    for p in ring_pairs:
        capacity = links[p].capacity_gbps * 1e9 / 8
        room.append(max(capacity * settings.LINK_MAX_SHARE - others.get(p, 0.0), capacity * 0.05))
    return min(room), max(links[p].latency_ms for p in ring_pairs) / 1000.0


def crossing_counts() -> dict[tuple[int, int], int]:
    """How many running jobs took a share of each link, by (datacenter id, datacenter id)."""
    counts: dict[tuple[int, int], int] = {}
    rows = Job.objects.filter(state=JobState.RUNNING, link_loads__isnull=False).values_list(
        "link_loads", flat=True
    )
    for entries in rows:
        for a, b, _ in entries or ():
            pair = (min(a, b), max(a, b))
            counts[pair] = counts.get(pair, 0) + 1
    return counts


def jobs_crossing(link: DatacenterLink) -> list[int]:
    """The running jobs that took a share of ``link``."""
    pair = [link.a_id, link.b_id]
    rows = Job.objects.filter(state=JobState.RUNNING, link_loads__isnull=False).values_list(
        "id", "link_loads"
    )
    return [job_id for job_id, entries in rows if any(sorted(e[:2]) == pair for e in entries or ())]


def site_links(snapshot) -> SiteLinks:
    """The links between the snapshot's datacenters (indices), with the running jobs' loads."""
    index = {int(dc): i for i, dc in enumerate(snapshot.datacenter_id)}
    links = []
    for link in DatacenterLink.objects.select_related("a", "b"):
        if link.a_id in index and link.b_id in index:
            links.append(
                SiteLink(
                    index[link.a_id],
                    index[link.b_id],
                    link.lanes,
                    link.lane_gbps,
                    link.latency_ms,
                    lanes_lost=link.lanes_lost,
                    down=link.down,
                    name=f"{link.a.name}<->{link.b.name}",
                )
            )
    book = SiteLinks(links, settings.LINK_MAX_SHARE)
    for (a, b), load in running_loads().items():
        if a in index and b in index:
            book.add((index[a], index[b]), load)
    return book


def as_stored(snapshot, loads) -> list[list] | None:
    """An admission's link loads (snapshot indices) as ``Job.link_loads`` keeps them (ids)."""
    if not loads:
        return None
    ids = snapshot.datacenter_id
    return [[int(ids[a]), int(ids[b]), round(float(load), 1)] for (a, b), load in loads]
