"""The links between datacenters as a scheduled resource, and when spanning them pays (pure).

A link between two datacenters has lanes (e.g. 8 x 400 Gb/s), a distance, a one-way latency
(5 us per km of fibre when not given; light in glass covers a km in no less than 4.9 us) and a
state: ``up``, ``degraded`` (lanes lost) or ``down``. Its capacity is the lanes left, and no
placement takes it above ``max_share`` (default 90%) of that: a job crossing it takes its
modelled share (its gradient bytes per step over its step time), like quota.

Whether a job that no single datacenter holds now should span several is decided by comparing
(a) its slowdown across them: the step-time model (engine.steptime) with tensor and pipeline
parallelism kept inside a datacenter, the data-parallel gradients as a hierarchical all-reduce
over the links (reduce-scatter inside each site, all-reduce of the shards across), the links'
latency, and only the bandwidth they have left after the jobs already crossing them; with (b)
the expected wait until one datacenter could hold it (from the running jobs' estimated ends,
as a reservation is found). It spans when the wait saved exceeds the time lost:
``wait > slowdown x duration x (1 + margin)``. Policies: ``never`` span, span ``whenever`` no
datacenter holds the job (within the links' capacity), span when it ``pays``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

from engine.reasons import duration
from engine.stagecut import DATACENTER_LEVEL, chain, cut_plan, round3
from engine.stagecut import describe as describe_stages
from engine.steptime import MODELS, Fabric, ModelSpec, NoFeasiblePlan, Plan, _ranked, one_site_table

LINK_STATES = ("up", "degraded", "down")
SPAN_POLICIES = ("never", "whenever", "pays")
SPANNING = ("region", "any")  # the topology constraints that let a gang span datacenters
FIBRE_US_PER_KM = 5.0  # the default one-way latency: light in fibre plus a little equipment
FIBRE_MIN_US_PER_KM = 4.9  # the physical floor: c / 1.468 (the refractive index of silica fibre)
FIBRE_MIN_MS_PER_KM = FIBRE_MIN_US_PER_KM / 1000.0
DEFAULT_LANE_GBPS = 400.0  # one wavelength of a DCI system (400ZR)
DEFAULT_MAX_SHARE = 0.9
DEFAULT_MARGIN = 0.1
DEFAULT_DURATION_S = 24 * 3600.0  # weighed for a job that gives no estimated duration
DEFAULT_MODEL = "llama3-70b"  # the shape assumed for a job that describes no model


def default_latency_ms(distance_km: float) -> float:
    return distance_km * FIBRE_US_PER_KM / 1000.0


def min_latency_ms(distance_km: float) -> float:
    return distance_km * FIBRE_MIN_MS_PER_KM


def link_state(lanes: int, lanes_lost: int, down: bool) -> str:
    """``down`` when marked down or every lane is lost, ``degraded`` with some lost, else ``up``."""
    if down or lanes_lost >= lanes:
        return "down"
    return "degraded" if lanes_lost > 0 else "up"


@dataclass(frozen=True)
class SiteLink:
    """One link between datacenters ``a`` < ``b`` (snapshot datacenter indices)."""

    a: int
    b: int
    lanes: int
    lane_gbps: float  # Gb/s per lane
    latency_ms: float
    lanes_lost: int = 0
    down: bool = False
    name: str = ""

    @property
    def state(self) -> str:
        return link_state(self.lanes, self.lanes_lost, self.down)

    @property
    def capacity_bytes(self) -> float:
        """Bytes per second the link carries now (0 when down)."""
        if self.state == "down":
            return 0.0
        return (self.lanes - self.lanes_lost) * self.lane_gbps * 1e9 / 8


def ring(dcs: tuple[int, ...]) -> list[tuple[int, int]]:
    """The links a hierarchical all-reduce over ``dcs`` uses: a ring through them in order (one
    link for two datacenters, three for three)."""
    k = len(dcs)
    if k < 2:
        return []
    if k == 2:
        return [(min(dcs), max(dcs))]
    return [tuple(sorted((dcs[i], dcs[(i + 1) % k]))) for i in range(k)]


class SiteLinks:
    """The links of a fleet with the load the jobs crossing them take (bytes/s per pair)."""

    def __init__(self, links: list[SiteLink], max_share: float = DEFAULT_MAX_SHARE):
        self.links = {(min(k.a, k.b), max(k.a, k.b)): k for k in links}
        self.max_share = max_share
        self.load: dict[tuple[int, int], float] = {}

    def copy(self) -> SiteLinks:
        out = SiteLinks(list(self.links.values()), self.max_share)
        out.load = dict(self.load)
        return out

    def taken(self, shares) -> SiteLinks:
        """A copy with the running jobs' shares added (each a job's ((pair, bytes/s), ...))."""
        out = self.copy()
        for loads in shares:
            for pair, load in loads:
                out.add(pair, load)
        return out

    def add(self, pair: tuple[int, int], bytes_per_s: float) -> None:
        pair = (min(pair), max(pair))
        self.load[pair] = self.load.get(pair, 0.0) + bytes_per_s

    def headroom(self, pair: tuple[int, int]) -> float:
        """Bytes per second a new job may still take on the link (0 without a link)."""
        link = self.links.get((min(pair), max(pair)))
        if link is None:
            return 0.0
        return max(0.0, link.capacity_bytes * self.max_share - self.load.get(pair, 0.0))

    def utilization(self, pair: tuple[int, int]) -> float:
        link = self.links.get(pair)
        if link is None or link.capacity_bytes <= 0:
            return 0.0 if not self.load.get(pair) else math.inf
        return self.load.get(pair, 0.0) / link.capacity_bytes

    def name(self, pair: tuple[int, int]) -> str:
        link = self.links.get(pair)
        return link.name if link is not None and link.name else f"{pair[0]}<->{pair[1]}"


def links_from_spec(spec, max_share: float = DEFAULT_MAX_SHARE) -> SiteLinks:
    """The links of a topology spec (engine.topology_spec), by datacenter index in spec order (the
    order snapshots and the database builder use), with no load."""
    order = [(region.name, dc.name) for region, dc in spec.datacenters()]
    links = []
    for link in spec.links:
        a, b = sorted((order.index(link.a), order.index(link.b)))
        links.append(
            SiteLink(a, b, link.lanes, link.lane_gbps, link.latency_ms, name=f"{link.a[1]}<->{link.b[1]}")
        )
    return SiteLinks(links, max_share)


@dataclass(frozen=True)
class SpanCost:
    """What spanning ``dcs`` costs a job: its step time there against inside one datacenter."""

    dcs: tuple[int, ...]
    one_step_s: float
    span_step_s: float
    loads: tuple[tuple[tuple[int, int], float], ...]  # (link, bytes/s) the job would take
    # "replicas": (datacenter, whole model replicas there), by datacenter; "stages": (datacenter,
    # pipeline stages of every replica there), in pipeline order (engine.stagecut)
    stages: tuple[tuple[int, int], ...]
    plan: str  # e.g. "TP8 PP4 DP32"
    # what each datacenter holds: whole replicas, whole pipeline stages, or ("chips") a mixed-chip
    # gang's GPUs, ``stages`` then being (datacenter, GPUs there)
    cut: str = "replicas"

    @property
    def slowdown(self) -> float:
        return self.span_step_s / self.one_step_s - 1.0

    def layout(self, names: dict[int, str]) -> str:
        """Which part of the job runs where, e.g. "TP8 PP16 DP64, stages 1-10 in bj1, 11-16 in
        bj2", "TP8 PP4 DP32, replicas: 24 in bj1, 8 in bj2" or "24 H100-SXM + 24 H200,
        data-parallel split, GPUs: 24 in bj1, 24 in bj2"."""
        if self.cut == "stages":
            return f"{self.plan}, {describe_stages(self.stages, names)}"
        each = ", ".join(f"{n} in {names.get(dc, str(dc))}" for dc, n in self.stages)
        return f"{self.plan}, {'GPUs' if self.cut == 'chips' else 'replicas'}: {each}"


@lru_cache(maxsize=8192)
def _step(model: ModelSpec, chip: str, gpus: int, k: int, link_gbytes: float, latency_s: float, whole: int):
    """The best plan on ``gpus`` over ``k`` datacenters (None: none fits). Across datacenters
    only plans that keep whole model replicas (TP x PP GPUs, a divisor of ``whole``: the GCD of
    the GPUs in each) inside each datacenter qualify: tensor and pipeline traffic never crosses
    a link, the gradients' all-reduce does."""
    if k == 1:
        return one_site_table(model, chip, gpus, DATACENTER_LEVEL).build(0)
    fabric = Fabric()
    lat = list(fabric.latency_s)
    lat[4] = latency_s
    fabric = replace(fabric, datacenter_link_gbps=link_gbytes, latency_s=tuple(lat))
    build, order = _ranked(
        model,
        chip,
        gpus,
        fabric,
        DATACENTER_LEVEL + 1,
        k,
        None,
        keep=lambda t, p, d: (whole % (t * p) == 0) & (d >= k),
    )
    return build(int(order[0])) if len(order) else None


@lru_cache(maxsize=4096)
def replica_sizes(model: ModelSpec | None, chip: str, gpus: int, most: int = 6) -> tuple[int, ...]:
    """The GPUs of one model replica (TP x PP) of the job's best plans inside one datacenter,
    best plan first, distinct, at most ``most``: the quanta a split across datacenters may keep
    whole ((1,) when no plan fits)."""
    try:
        table = one_site_table(model or MODELS[DEFAULT_MODEL], chip, gpus, DATACENTER_LEVEL)
    except (NoFeasiblePlan, KeyError):
        return (1,)
    sizes: list[int] = []
    for size in (table.tp * table.pp).tolist():
        if size not in sizes:
            sizes.append(size)
            if len(sizes) == most:
                break
    return tuple(sizes) or (1,)


def replica_split(free: dict[int, int], gpus: int, quantum: int) -> dict[int, int] | None:
    """GPUs per datacenter for a gang of ``gpus`` over datacenters with ``free`` GPUs: whole
    replicas of ``quantum`` GPUs, the fullest datacenters first, the remainder (gpus % quantum,
    idle in the plan) where room is left; None when whole replicas do not fit."""
    replicas, rest = divmod(gpus, quantum)
    split: dict[int, int] = {}
    for dc in sorted(free, key=lambda d: -free[d]):
        take = min(free[dc] // quantum, replicas)
        if take:
            split[dc] = take * quantum
            replicas -= take
    if replicas:
        return None
    for dc in sorted(free, key=lambda d: -(free[d] - split.get(d, 0))):
        room = free[dc] - split.get(dc, 0)
        if rest and room:
            extra = min(room, rest)
            split[dc] = split.get(dc, 0) + extra
            rest -= extra
    return None if rest else split


class SitePlan(NamedTuple):
    """A job's plan across datacenters: the plan, what each datacenter holds (``cut``:
    "replicas" or "stages") and how many of them, per datacenter (stages in pipeline order), and
    the bytes per step it sends over each link it crosses."""

    plan: Plan
    cut: str
    parts: tuple[tuple[int, int], ...]
    bytes_per_step: float = 0.0


PLAN_TOLERANCE = 0.01  # of the plans within 1% of the fastest step, the one taking least of the links


def fastest(options, step, load):
    """The plan to run of ``options``: of those within PLAN_TOLERANCE of the fastest ``step``, the
    one with the least ``load`` on the links (links are shared: several times the load for a
    tenth of a percent of speed is a poor trade). None without options."""
    if not options:
        return None
    best = min(step(o) for o in options)
    return min((o for o in options if step(o) <= best * (1 + PLAN_TOLERANCE)), key=load)


def span_plan(
    model: ModelSpec, chip: str, split: dict[int, int], room_bytes: float, latency_s: float
) -> SitePlan | None:
    """The plan on ``split`` ({datacenter: GPUs}) with ``room_bytes`` per second left on the
    slowest link it crosses: whole replicas in each datacenter, or the pipeline cut at the links,
    chosen as ``fastest`` does (None: neither fits the split)."""
    gpus = sum(split.values())
    if len(split) < 2:
        return SitePlan(_step(model, chip, gpus, 1, 0.0, 0.0, 0), "replicas", tuple(split.items()))
    options = []
    k = len(split)
    whole = _step(model, chip, gpus, k, round3(room_bytes / 1e9), latency_s, math.gcd(*split.values()))
    if whole is not None:
        replica = whole.tp * whole.pp
        parts = tuple((d, n // replica) for d, n in sorted(split.items()))
        options.append(SitePlan(whole, "replicas", parts, gradient_bytes(model, k)))
    cut = cut_plan(model, chip, tuple(sorted(split.items())), room_bytes, latency_s)
    if cut is not None:
        options.append(SitePlan(cut.plan, "stages", cut.stages, cut.bytes_per_step))
    return fastest(options, lambda o: o.plan.step_s, lambda o: o.bytes_per_step / o.plan.step_s)


def gradient_bytes(model: ModelSpec, k: int) -> float:
    """Bytes per step over each link of the ring: the shards' all-reduce sends 2(k-1)/k x 2 bytes
    per parameter."""
    return 2 * (k - 1) / k * 2.0 * model.params


def why_not(split: dict[int, int], links: SiteLinks) -> str:
    """Why spanning ``split``'s datacenters has no cost to weigh."""
    if any(links.headroom(p) <= 0 for p in ring(tuple(sorted(split)))):
        return "no link between the datacenters it would span has room left"
    return "no split across the datacenters with room keeps whole model replicas in each"


def span_cost(
    model: ModelSpec | None,
    chip: str,
    split: dict[int, int],
    links: SiteLinks,
    cuts: tuple[str, ...] = ("replicas", "stages"),
) -> SpanCost | None:
    """The cost of running ``model`` on ``split`` ({datacenter: GPUs}) over ``links``, the faster
    of whole replicas in each datacenter and the pipeline cut at the links (engine.stagecut; only
    those in ``cuts``); None when none has a plan whose links have room left (absent, down, or
    already at their share)."""
    model = model or MODELS[DEFAULT_MODEL]
    try:
        one = _step(model, chip, sum(split.values()), 1, 0.0, 0.0, 0)
    except (NoFeasiblePlan, KeyError):
        return None
    costs = {"replicas": _replicas_cost, "stages": _cut_cost}
    options = [c for c in (costs[cut](model, chip, split, links, one) for cut in cuts) if c]
    return fastest(options, lambda c: c.span_step_s, lambda c: sum(load for _, load in c.loads))


def _replicas_cost(
    model: ModelSpec, chip: str, split: dict[int, int], links: SiteLinks, one
) -> SpanCost | None:
    """Whole replicas in each datacenter: the gradients' all-reduce crosses a ring of links."""
    dcs = tuple(sorted(split))
    gpus = sum(split.values())
    pairs = ring(dcs)
    room = [links.headroom(p) for p in pairs]
    if not pairs or min(room) <= 0:
        return None
    latency_s = max(links.links[p].latency_ms for p in pairs) / 1000.0
    try:
        # the ring's slowest link bounds the all-reduce: rounded to 3 digits so that the cache holds
        span = _step(
            model, chip, gpus, len(dcs), round3(min(room) / 1e9), latency_s, math.gcd(*split.values())
        )
    except (NoFeasiblePlan, KeyError):
        return None
    if span is None:
        return None
    k = len(dcs)
    per_link = min(gradient_bytes(model, k) / span.step_s, min(room))
    replica = span.tp * span.pp
    return SpanCost(
        dcs=dcs,
        one_step_s=one.step_s,
        span_step_s=span.step_s,
        loads=tuple((p, per_link) for p in pairs),
        stages=tuple((dc, n // replica) for dc, n in sorted(split.items())),
        plan=f"TP{span.tp} PP{span.pp} DP{span.dp}",
    )


def _cut_cost(model: ModelSpec, chip: str, split: dict[int, int], links: SiteLinks, one) -> SpanCost | None:
    """The pipeline cut at the links: activations cross a chain of links (engine.stagecut)."""
    dcs = tuple(sorted(split))
    room = {(a, b): links.headroom((a, b)) for i, a in enumerate(dcs) for b in dcs[i + 1 :]}
    order = chain(split, room)
    if order is None:
        return None
    pairs = [(min(a, b), max(a, b)) for a, b in zip(order, order[1:], strict=False)]
    least = min(room[p] for p in pairs)
    latency_s = max(links.links[p].latency_ms for p in pairs) / 1000.0
    try:
        cut = cut_plan(model, chip, tuple((dc, split[dc]) for dc in order), least, latency_s)
    except KeyError:
        return None
    if cut is None:
        return None
    load = min(cut.bytes_per_step / cut.plan.step_s, least)
    return SpanCost(
        dcs=dcs,
        one_step_s=one.step_s,
        span_step_s=cut.plan.step_s,
        loads=tuple((p, load) for p in pairs),
        stages=cut.stages,
        plan=f"TP{cut.plan.tp} PP{cut.plan.pp} DP{cut.plan.dp}",
        cut="stages",
    )


@dataclass(frozen=True)
class SpanChoice:
    span: bool
    note: str  # why, with both numbers
    cost: SpanCost | None = None
    wait_s: float | None = None


def decide(
    cost: SpanCost | None,
    names: dict[int, str],
    wait_s: float | None,
    wait_in: str,
    duration_s: float | None,
    policy: str = "pays",
    margin: float = DEFAULT_MARGIN,
    links: SiteLinks | None = None,
    why_none: str = "no link between the datacenters it would span has room left",
) -> SpanChoice:
    """Span or wait. ``wait_s``: the expected wait until datacenter ``wait_in`` could hold the job
    (None: no estimate, as when no running job there has an estimated end)."""
    if policy == "never":
        return SpanChoice(False, "spanning datacenters is off (policy never)", cost, wait_s)
    if cost is None:
        return SpanChoice(False, why_none, None, wait_s)
    where = "+".join(names.get(d, str(d)) for d in cost.dcs)
    over = ", ".join(links.name(p) for p, _ in cost.loads) if links is not None else ""
    run_s = duration_s if duration_s is not None else DEFAULT_DURATION_S
    extra = cost.slowdown * run_s
    slower = f"{cost.slowdown * 100:.1f}% slower (+{duration(extra)} over {duration(run_s)})"
    if extra < 0:  # a mixed-chip plan across the link can beat one datacenter's chip type
        slower = f"{-cost.slowdown * 100:.1f}% faster (-{duration(-extra)} over {duration(run_s)})"
    plan = f"; {cost.layout(names)}"
    if policy == "whenever":
        return SpanChoice(True, f"spans {where} over {over}: {slower} (policy whenever){plan}", cost, wait_s)
    if wait_s is None or wait_s > extra * (1 + margin):
        starts = (
            "no datacenter has an estimated time to hold it"
            if wait_s is None
            else (f"starts now instead of in about {duration(wait_s)} in {wait_in}")
        )
        return SpanChoice(True, f"spans {where} over {over}: {slower}, {starts}{plan}", cost, wait_s)
    return SpanChoice(
        False,
        f"waits for {wait_in} (about {duration(wait_s)}) rather than span {where}: {slower}",
        cost,
        wait_s,
    )


def shrink_or_span(
    cost: SpanCost | None,
    gpus: int,
    names: dict[int, str],
    inside_step_s: float | None,
    inside_gpus: int,
    policy: str = "pays",
    margin: float = DEFAULT_MARGIN,
    links: SiteLinks | None = None,
) -> SpanChoice:
    """An elastic job, starting now either way: at ``gpus`` across datacenters (``cost``), or
    at the ``inside_gpus`` one datacenter holds now (step time ``inside_step_s``; None when no
    size fits one). Its work per step is the same at every size, so it spans when its step time
    across, with the margin, is the shorter (``whenever``: when it is larger at all)."""
    if cost is None:
        if not inside_gpus:
            return SpanChoice(False, "")
        return SpanChoice(
            False, f"runs at the {inside_gpus} GPUs one datacenter holds: no link has room left"
        )
    where = "+".join(names.get(d, str(d)) for d in cost.dcs)
    over = ", ".join(links.name(p) for p, _ in cost.loads) if links is not None else ""
    gain = (inside_step_s / cost.span_step_s) if inside_step_s else None
    figures = f"{cost.slowdown * 100:.1f}% slower than one datacenter at {gpus} GPUs"
    if gain is not None:
        figures += f", {gain:.2f}x the throughput of the {inside_gpus} GPUs one datacenter holds now"
    if policy == "whenever" or gain is None or gain > 1 + margin:
        note = f"spans {where} over {over} at {gpus} GPUs: {figures}; {cost.layout(names)}"
        return SpanChoice(True, note, cost)
    return SpanChoice(
        False,
        f"runs at the {inside_gpus} GPUs one datacenter holds rather than span {where}: {figures}",
        cost,
    )


def one_site_step_s(model: ModelSpec | None, chip: str, gpus: int) -> float | None:
    """The job's best step time on ``gpus`` inside one datacenter (None: no plan fits)."""
    try:
        plan = _step(model or MODELS[DEFAULT_MODEL], chip, gpus, 1, 0.0, 0.0, 0)
    except (NoFeasiblePlan, KeyError):
        return None
    return plan.step_s if plan is not None else None
