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
        # (chip, level limit) -> the smallest gang that found no room among all free GPUs. Free
        # GPUs only shrink until something is given back, so nothing larger will find room either.
        self._no_room_all: dict[tuple[int, int], int] = {}
        # (chip, gpus, level limit) -> room found among all free GPUs, valid until ``all`` changes
        self._room_all: dict[tuple[int, int, int], bool] = {}

    @property
    def reserving(self) -> bool:
        """Whether some GPUs are reserved (the two pools differ)."""
        return self.open is not self.all

    def set_congestion(self, pods) -> None:
        """The pods whose fabric links are congested: their racks and pods are chosen last."""
        self.all.set_congestion(pods)
        if self.reserving:
            self.open.set_congestion(pods)

    # --- placing ---------------------------------------------------------------------------
    def place(self, chip: int, gpus: int, max_level: int, within: tuple[int, int] | None = None):
        """Place a gang on GPUs nobody reserved; returns (GPUs, level, domain) or None."""
        placed = self.open.place(chip, gpus, max_level, within=within)
        if placed is not None and self.reserving:
            self.all.take(placed[0])
            self._all_shrank()
        return placed

    def place_backfill(self, chip: int, gpus: int, max_level: int):
        """Place a gang that ends before the reservations start: reserved GPUs may be used."""
        if not self.reserving:
            return None
        placed = self.all.place(chip, gpus, max_level)
        if placed is not None:
            self.open.take_where_free(placed[0])
            self._all_shrank()
        return placed

    def _room_in_all(self, chip: int, gpus: int, max_level: int) -> bool:
        known = self._no_room_all.get((chip, max_level))
        if known is not None and gpus >= known:
            return False
        found = self._room_all.get((chip, gpus, max_level))
        if found:
            return True
        if self.all.find(chip, gpus, max_level) is not None:
            self._room_all[(chip, gpus, max_level)] = True
            return True
        self._no_room_all[(chip, max_level)] = gpus if known is None else min(gpus, known)
        return False

    def _all_shrank(self) -> None:
        self._room_all.clear()  # room found before may be gone; no room stays no room

    def free_only_if_reserved(self, chip: int, gpus: int, max_level: int) -> bool:
        """A gang finds no room among open GPUs but would among all of them."""
        return self.reserving and self._room_in_all(chip, gpus, max_level)

    def blocked_everywhere(self, chip: int, gpus: int, max_level: int) -> bool:
        """A gang that found no open room has none among reserved GPUs either."""
        return not self.reserving or not self._room_in_all(chip, gpus, max_level)

    # --- changing ---------------------------------------------------------------------------
    def take(self, indices: np.ndarray) -> None:
        """Chosen GPUs (from ``open``) are taken."""
        self.open.take(indices)
        if self.reserving:
            self.all.take(indices)
            self._all_shrank()

    def give(self, indices: np.ndarray) -> None:
        """GPUs become free (a job left or shrank); ``indices`` must be schedulable and unreserved."""
        self._no_room_all.clear()
        self._room_all.clear()
        self.all.give(indices)
        if self.reserving:
            self.open.give(indices)

    def take_back(self, indices: np.ndarray) -> None:
        """Undo a ``give`` (where those GPUs are still free)."""
        self._no_room_all.clear()
        self._room_all.clear()
        self.all.take_where_free(indices)
        if self.reserving:
            self.open.take_where_free(indices)

    def reserve(self, indices: np.ndarray) -> None:
        """Keep ``indices`` for a blocked gang: they leave ``open`` and stay in ``all``."""
        if not self.reserving:
            self.open = self.all.copy()
        self.open.take_where_free(indices)
