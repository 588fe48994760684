"""The free GPUs of one scheduling cycle, kept twice once something is reserved.

``all`` holds every free GPU; ``open`` holds those not reserved for a blocked gang. Until the
first reservation they are the same pool, so every update is made once. New work is placed from
``open``; a backfilled job (one that ends before the reservation starts) may also use reserved
GPUs, from ``all``. Every change here keeps the two consistent, so the steps of the cycle never
need to ask which pool is which.
"""

from __future__ import annotations

import numpy as np

from engine.placement import FreePool, Layout


class Pools:
    def __init__(self, layout: Layout, free: np.ndarray):
        self.all = FreePool(layout, free)
        self.open = self.all

    @property
    def reserving(self) -> bool:
        """Whether some GPUs are reserved (the two pools differ)."""
        return self.open is not self.all

    # --- placing ---------------------------------------------------------------------------
    def place(self, chip: int, gpus: int, max_level: int, within: tuple[int, int] | None = None):
        """Place a gang on GPUs nobody reserved; returns (GPUs, level, domain) or None."""
        placed = self.open.place(chip, gpus, max_level, within=within)
        if placed is not None and self.reserving:
            self.all.take(placed[0])
        return placed

    def place_backfill(self, chip: int, gpus: int, max_level: int):
        """Place a gang that ends before the reservations start: reserved GPUs may be used."""
        if not self.reserving:
            return None
        placed = self.all.place(chip, gpus, max_level)
        if placed is not None:
            self.open.take_where_free(placed[0])
        return placed

    def free_only_if_reserved(self, chip: int, gpus: int, max_level: int) -> bool:
        """A gang finds no room among open GPUs but would among all of them."""
        return self.reserving and self.all.find(chip, gpus, max_level) is not None

    def blocked_everywhere(self, chip: int, gpus: int, max_level: int) -> bool:
        """A gang that found no open room has none among reserved GPUs either."""
        return not self.reserving or self.all.find(chip, gpus, max_level) is None

    # --- changing ---------------------------------------------------------------------------
    def take(self, gpus: np.ndarray) -> None:
        """Chosen GPUs (from ``open``) are taken."""
        self.open.take(gpus)
        if self.reserving:
            self.all.take(gpus)

    def give(self, gpus: np.ndarray) -> None:
        """GPUs become free (a job left or shrank); ``gpus`` must be schedulable and unreserved."""
        self.all.give(gpus)
        if self.reserving:
            self.open.give(gpus)

    def take_back(self, gpus: np.ndarray) -> None:
        """Undo a ``give`` (where those GPUs are still free)."""
        self.all.take_where_free(gpus)
        if self.reserving:
            self.open.take_where_free(gpus)

    def reserve(self, gpus: np.ndarray) -> None:
        """Keep ``gpus`` for a blocked gang: they leave ``open`` and stay in ``all``."""
        if not self.reserving:
            self.open = self.all.copy()
        self.open.take_where_free(gpus)
