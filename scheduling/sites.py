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
        max_starts=settings.CYCLE_MAX_STARTS or None,
        span_policy=settings.SPAN_POLICY,
        span_margin=settings.SPAN_MARGIN,
        **kw,
    )


def running_shares(exclude: int | None = None) -> list[tuple[int, list]]:
    """(job id, [[dc a, dc b, bytes/s], ...]) of every running job that took a share of a link."""
    rows = Job.objects.filter(state=JobState.RUNNING, link_loads__isnull=False)
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    return [(job_id, entries or []) for job_id, entries in rows.values_list("id", "link_loads")]


def running_loads(exclude: int | None = None, shares=None) -> dict[tuple[int, int], float]:
    """Bytes per second the running jobs take on each link, by (datacenter id, datacenter id)."""
    loads: dict[tuple[int, int], float] = {}
    for _, entries in running_shares(exclude) if shares is None else shares:
        for a, b, load in entries:
            pair = (min(a, b), max(a, b))
            loads[pair] = loads.get(pair, 0.0) + float(load)
    return loads


def crossing_counts(shares=None) -> dict[tuple[int, int], int]:
    """How many running jobs took a share of each link, by (datacenter id, datacenter id)."""
    counts: dict[tuple[int, int], int] = {}
    for _, entries in running_shares() if shares is None else shares:
        for a, b, _ in entries:
            pair = (min(a, b), max(a, b))
            counts[pair] = counts.get(pair, 0) + 1
    return counts


def jobs_crossing(link: DatacenterLink) -> list[int]:
    """The running jobs that took a share of ``link``."""
    pair = [link.a_id, link.b_id]
    return [job_id for job_id, entries in running_shares() if any(sorted(e[:2]) == pair for e in entries)]


def load_of(link: DatacenterLink, loads: dict[tuple[int, int], float]) -> tuple[float, float | None]:
    """(Gb/s the running jobs take on ``link``, that over its capacity now: None when it carries
    nothing yet is loaded)."""
    load = loads.get((link.a_id, link.b_id), 0.0) * 8 / 1e9
    if link.capacity_gbps <= 0:
        return load, (None if load else 0.0)
    return load, load / link.capacity_gbps


def _site_link(link: DatacenterLink, a: int, b: int) -> SiteLink:
    """The engine's view of ``link`` between datacenters ``a`` and ``b`` (ids or indices)."""
    return SiteLink(
        a,
        b,
        link.lanes,
        link.lane_gbps,
        link.latency_ms,
        lanes_lost=link.lanes_lost,
        down=link.down,
        name=f"{link.a.name}<->{link.b.name}",
    )


def room_for(job_id: int | None, dc_ids: list[int]) -> tuple[float, float] | None:
    """(bytes/s, one-way latency s) the slowest link among ``dc_ids`` leaves a job, the other
    running jobs' shares taken out (None: a link is missing or down). Never below 5% of the link:
    a job on it gets at least that much however many others joined."""
    ring_pairs = ring(tuple(sorted(dc_ids)))
    rows = DatacenterLink.objects.filter(a_id__in=dc_ids, b_id__in=dc_ids).select_related("a", "b")
    book = SiteLinks([_site_link(k, k.a_id, k.b_id) for k in rows], settings.LINK_MAX_SHARE)
    if not ring_pairs or any(p not in book.links or book.links[p].state == "down" for p in ring_pairs):
        return None
    book.load = running_loads(exclude=job_id)
    room = [max(book.headroom(p), book.links[p].capacity_bytes * 0.05) for p in ring_pairs]
    return min(room), max(book.links[p].latency_ms for p in ring_pairs) / 1000.0


def site_links(snapshot) -> SiteLinks:
    """The links between the snapshot's datacenters (indices), with the running jobs' loads."""
    index = {int(dc): i for i, dc in enumerate(snapshot.datacenter_id)}
    links = [
        _site_link(link, index[link.a_id], index[link.b_id])
        for link in DatacenterLink.objects.select_related("a", "b")
        if link.a_id in index and link.b_id in index
    ]
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
