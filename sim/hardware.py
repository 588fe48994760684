"""The simulated cluster's hardware: faults drawn by the fleet model (sim.fleet), judged by the
production fault verdict (engine.lifecycle.judge), and node and GPU states changed only through
the state tables (engine.states), out of service for as long as the verdict's repair takes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from engine.lifecycle import Verdict, judge
from engine.physics import Physics
from engine.placement import Layout
from engine.states import NODE_STATE_CODE, InvalidTransition, gpu_event_code, node_event_code
from engine.topology import TopologySnapshot
from sim.fleet import Fleet, FleetConfig

READY = NODE_STATE_CODE["ready"]


class Hardware:
    """Nodes and GPUs of one simulation. ``push(t, kind, *payload)`` plans an event of the
    simulation's loop: the next drawn ``fault`` and the ``node_back``/``gpu_back`` of a repair."""

    def __init__(
        self,
        topo: TopologySnapshot,
        layout: Layout,
        ph: Physics,
        fleet: FleetConfig,
        seed: int,
        push: Callable[..., None],
    ):
        self.topo, self.layout, self.ph = topo, layout, ph
        self.fleet = Fleet(topo, ph, fleet, seed=seed)
        self.push = push
        self.history: dict[int, list[tuple[float, str, int | None]]] = {}  # node -> (t, source, xid)
        self.quarantined: set[int] = set()  # lemon nodes: out until an operator clears them
        self.faults: Counter = Counter()  # by cause
        self.log: list[tuple[float, str, str]] = []  # (time, cause, action)

    def node_gpus(self, node: int) -> np.ndarray:
        start, count = int(self.layout.node_gpu_start[node]), int(self.layout.node_gpu_count[node])
        return np.arange(start, start + count)

    def draw_next(self, now: float) -> None:
        """Plan the next fault the fleet model draws among the ready nodes."""
        drawn = self.fleet.next_fault(now, self.topo.node_state == READY)
        if drawn is not None:
            self.push(drawn[0], "fault", drawn[1], drawn[2])

    def fault(
        self, node: int, now: float, source: str, xid: int | None, cause: str | None
    ) -> tuple[Verdict, np.ndarray]:
        """A fault on ``node`` now: judged with the node's history, counted, and applied to the
        node's or a GPU's state. Returns the verdict and the GPU indices that left service."""
        history = self.history.setdefault(node, [])
        v = judge(history, now, source, xid)
        history.append((now, source, xid))
        c = v.classification
        self.faults[cause or c.cause] += 1
        self.log.append((now, cause or c.cause, c.action.value))
        node_gpus = self.node_gpus(node)
        faulty = self._take_out(node, node_gpus, v, now)
        self.fleet.ecc[node_gpus] += 1
        return v, faulty

    def _take_out(self, node: int, node_gpus: np.ndarray, v: Verdict, now: float) -> np.ndarray:
        """Apply the verdict to the node's and GPUs' states and plan when they return; returns the
        GPU indices that left service."""
        if v.node_down:
            try:
                code = node_event_code(int(self.topo.node_state[node]), "quarantine" if v.lemon else "fault")
            except InvalidTransition:
                return node_gpus  # already out of service: its return is planned already
            self.topo.node_state[node] = code
            if v.lemon:  # a lemon stays out until an operator clears it
                self.quarantined.add(node)
            else:
                self.push(now + self.ph.out_of_service_s(v.returns, self.fleet.rng), "node_back", node)
            return node_gpus
        if v.gpu_down:
            faulty = node_gpus[[int(self.fleet.rng.integers(len(node_gpus)))]]
            gpu = int(faulty[0])
            try:
                self.topo.gpu_state[gpu] = gpu_event_code(int(self.topo.gpu_state[gpu]), "fault")
            except InvalidTransition:
                return faulty  # already down: its reset is planned already
            self.push(now + self.ph.out_of_service_s(v.returns, self.fleet.rng), "gpu_back", gpu)
            return faulty
        return node_gpus[:0]

    def gpu_back(self, gpu: int) -> None:
        """A reset GPU returns to service."""
        self.topo.gpu_state[gpu] = gpu_event_code(int(self.topo.gpu_state[gpu]), "reset")

    def node_back(self, node: int) -> bool:
        """A rebooted or repaired node returns to service (down, repairing, ready: the table's
        path); a lemon does not. Returns whether it came back."""
        if node in self.quarantined:
            return False
        self.topo.node_state[node] = node_event_code(
            node_event_code(int(self.topo.node_state[node]), "repair"), "return"
        )
        return True
