"""The simulated fleet: per-GPU telemetry and the fault process, as NumPy arrays (pure, seeded).

Telemetry follows the work on each GPU: a busy GPU runs at its job's utilization, draws power
between idle and its chip's TDP in proportion, and runs hotter than the room; an idle GPU cools
to the room and draws idle power. The room follows a daily cycle (warmest in the afternoon).

Faults follow the physics of the faults issue (engine.physics): 4.74e-4 interruptions per GPU-day
(Llama 3), times the chip's failure-rate factor, ten times as often on the 1% of nodes that are
lemons; the Llama 3 cause mix; repair times lognormal (median 0.85 days, mean 5.5). The daily
temperature cycle modulates the rate (the seeds report GPU fault rates moving with midday
temperature swings): rate x (1 + swing x sin(...)), a modulation whose daily mean is 1, so the
calibrated mean rate is unchanged; ``temperature_swing`` is its amplitude (default 0.2, a
modelling assumption: no published figure for the size of the effect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.chips import BY_NAME
from engine.physics import Physics
from engine.topology import TopologySnapshot

DAY = 86_400.0


@dataclass(frozen=True)
class FleetConfig:
    room_c: float = 24.0  # mean room (inlet) temperature
    room_swing_c: float = 5.0  # daily swing of the room temperature, +/-
    warmest_hour: float = 15.0
    busy_rise_c: float = 45.0  # a GPU at 100% runs this much above the room
    idle_rise_c: float = 8.0
    idle_power_fraction: float = 0.12  # of TDP
    temperature_swing: float = 0.2  # fault-rate modulation over the day, +/- (mean 1)
    training_util: float = 0.92  # what a training step keeps the GPU at (SM activity)


class Fleet:
    """Per-GPU state of a whole cluster, and the draw of its next fault."""

    def __init__(
        self,
        topo: TopologySnapshot,
        physics: Physics | None = None,
        config: FleetConfig | None = None,
        seed: int = 0,
    ):
        self.topo = topo
        self.physics = physics or Physics()
        self.config = config or FleetConfig()
        self.rng = np.random.default_rng([seed, 7])
        n, m = topo.num_gpus, topo.num_nodes
        self.util = np.zeros(n, dtype=np.float32)  # 0..1
        self.memory = np.zeros(n, dtype=np.float32)  # fraction of HBM used
        self.temperature = np.full(n, self.config.room_c + self.config.idle_rise_c, dtype=np.float32)
        self.power = np.zeros(n, dtype=np.float32)  # watts
        self.ecc = np.zeros(n, dtype=np.int32)  # corrected + uncorrected errors seen
        tdp = np.array(
            [BY_NAME[c].tdp_watts if c in BY_NAME else 700 for c in topo.chip_names], dtype=np.float32
        )
        self.tdp = tdp[topo.gpu_chip]
        factor = np.array(
            [BY_NAME[c].failure_rate_factor if c in BY_NAME else 1.0 for c in topo.chip_names],
            dtype=np.float64,
        )
        ph = self.physics
        self.lemon = self.rng.random(m) < ph.lemon_node_fraction
        gpus_per_node = np.bincount(topo.gpu_node, minlength=m).astype(np.float64)
        base = ph.gpu_interruptions_per_day / DAY
        base /= 1 - ph.lemon_node_fraction + ph.lemon_node_fraction * ph.lemon_rate_factor
        lemon_factor = np.where(self.lemon, ph.lemon_rate_factor, 1.0)
        self.node_rate = base * gpus_per_node * factor[topo.node_chip] * lemon_factor
        self.cause_names, shares = ph.cause_shares()
        self.cause_p = np.asarray(shares)

    # --- the room and the fault rate -------------------------------------------------------
    def _phase(self, t: float) -> float:
        hour = (t % DAY) / 3600.0
        return math.sin(2 * math.pi * (hour - self.config.warmest_hour + 6) / 24)

    def room(self, t: float) -> float:
        return self.config.room_c + self.config.room_swing_c * self._phase(t)

    def rate_factor(self, t: float) -> float:
        """Fault-rate multiplier at ``t``: 1 + swing x the daily phase (mean 1 over a day)."""
        return 1.0 + self.config.temperature_swing * self._phase(t)

    def next_fault(self, t: float, in_service: np.ndarray) -> tuple[float, int, str] | None:
        """(time, node, cause) of the next fault after ``t`` among nodes in service (thinning over
        the daily modulation), or None when no node is in service."""
        rates = self.node_rate * in_service
        total = float(rates.sum())
        if total <= 0:
            return None
        ceiling = total * (1 + self.config.temperature_swing)
        while True:
            t += self.rng.exponential(1.0 / ceiling)
            if self.rng.random() * (1 + self.config.temperature_swing) <= self.rate_factor(t):
                break
        node = int(self.rng.choice(len(rates), p=rates / total))
        cause = self.cause_names[int(self.rng.choice(len(self.cause_names), p=self.cause_p))]
        return t, node, cause

    def repair_s(self) -> float:
        """A hands-on repair's length, drawn from the fleet's stream (engine.physics)."""
        return self.physics.out_of_service_s("repair", self.rng)

    # --- telemetry -------------------------------------------------------------------------
    def step(self, t: float, util: np.ndarray, memory: np.ndarray | None = None) -> None:
        """Set every GPU's telemetry at ``t`` for the given per-GPU utilization (0..1): temperature
        relaxes toward its steady state, power follows utilization, small noise on top."""
        cfg = self.config
        noise = self.rng.normal(0.0, 0.01, size=len(util)).astype(np.float32)
        self.util = np.clip(util.astype(np.float32) + noise * (util > 0), 0.0, 1.0)
        self.memory = (memory if memory is not None else 0.85 * (self.util > 0)).astype(np.float32)
        steady = self.room(t) + cfg.idle_rise_c + (cfg.busy_rise_c - cfg.idle_rise_c) * self.util
        self.temperature += 0.5 * (steady - self.temperature)
        self.power = self.tdp * (cfg.idle_power_fraction + (1 - cfg.idle_power_fraction) * self.util)

    def frame(self) -> dict[str, np.ndarray]:
        """Quantized per-GPU values (one byte each): what the live store and the dashboard carry."""
        return {
            "util": np.round(self.util * 100).astype(np.uint8),
            "memory": np.round(self.memory * 100).astype(np.uint8),
            "temperature": np.clip(np.round(self.temperature), 0, 255).astype(np.uint8),
            "power": np.round(np.clip(self.power / self.tdp, 0, 1) * 100).astype(np.uint8),
            "health": self.topo.gpu_health.astype(np.uint8),
        }
