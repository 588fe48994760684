"""Job arrays: one submit for many jobs that differ only by their index (Slurm's ``--array``).

An array's indices are written as Slurm writes them: ranges and single indices separated by
commas, a range with an optional step (``0-9999``, ``1,3,5-9``, ``0-98:2``), and at most one
``%N`` at the end: no more than N of its jobs run at once. The engine honours that limit in
every cycle (``limited``); the API only parses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from engine.reasons import Reason

DEFAULT_MAX_SIZE = 100_000  # an array of more jobs than this is refused (MYRIAD_ARRAY_MAX_SIZE)
MAX_INDEX = 2**31 - 1  # indices fit the database's integer column
_PART = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


class ArrayError(ValueError):
    """An array specification that cannot be used; ``field`` names what to fix."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class ArraySpec:
    text: str  # as written, e.g. "0-9999%500"
    indices: np.ndarray  # int64, in the order written (ascending within each range)
    max_running: int | None  # None: no limit of its own

    @property
    def size(self) -> int:
        return len(self.indices)


def parse(text: str, max_size: int = DEFAULT_MAX_SIZE, field: str = "array") -> ArraySpec:
    """The indices and the running limit of ``text``; ArrayError names ``field`` when it is not
    a valid array or has more than ``max_size`` indices. The size is counted before any index is
    made, so ``0-999999999`` is refused without building a billion of them."""
    if not isinstance(text, str) or not text.strip():
        raise ArrayError(field, 'give the indices as "0-99", "1,3,5-9", "0-98:2", optionally with "%N"')
    body, _, limit_text = text.strip().partition("%")
    max_running = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ArrayError(field, f"the running limit after % must be a whole number >= 1: {limit_text!r}")
        max_running = int(limit_text)
    ranges, count = [], 0
    for part in body.split(","):
        part = part.strip()
        match = _PART.fullmatch(part)
        if not match:
            raise ArrayError(field, f"{part!r} is not an index, a range A-B or a range with a step A-B:S")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        step = int(match[3]) if match[3] is not None else 1
        if last < first:
            raise ArrayError(field, f"range {part!r} ends before it starts")
        if step < 1:
            raise ArrayError(field, f"range {part!r} has a step below 1")
        if last > MAX_INDEX:
            raise ArrayError(field, f"index {last} is above the largest index, {MAX_INDEX}")
        count += (last - first) // step + 1
        if count > max_size:
            raise ArrayError(field, f"more than {max_size:,} indices; the largest array is {max_size:,} jobs")
        ranges.append((first, last, step))
    indices = np.concatenate([np.arange(a, b + 1, s, dtype=np.int64) for a, b, s in ranges])
    if len(ranges) > 1 and len(np.unique(indices)) < len(indices):
        seen, counts = np.unique(indices, return_counts=True)
        raise ArrayError(field, f"index {int(seen[counts > 1][0])} is given more than once")
    return ArraySpec(text.strip(), indices, max_running)


def indices_problem(
    text: str, known: np.ndarray, max_size: int = DEFAULT_MAX_SIZE, field: str = "indices"
) -> tuple[np.ndarray, str | None]:
    """The indices ``text`` names among an array's ``known`` indices (an action on some of its
    jobs), or an error naming one that is not in the array."""
    try:
        wanted = parse(text, max_size=max_size, field=field).indices
    except ArrayError as exc:
        return np.empty(0, dtype=np.int64), exc.message
    missing = np.setdiff1d(wanted, known)
    if len(missing):
        return wanted, f"index {int(missing[0])} is not in this array"
    return wanted, None


def running_counts(running, counts: dict[int, int] | None = None) -> dict[int, int]:
    """Array id -> how many of its jobs run now (``counts``: added to these, which it returns)."""
    counts = {} if counts is None else counts
    for job in running:
        if job.array is not None:
            counts[job.array] = counts.get(job.array, 0) + 1
    return counts


def limited(counts: dict[int, int], reasons: dict[int, Reason], job) -> Reason | None:
    """Why ``job`` waits for its array's running limit, or None when it may be scheduled. One
    reason per array, shared by its waiting jobs (ten thousand of them would write the same)."""
    if job.array is None or job.array_limit is None or counts.get(job.array, 0) < job.array_limit:
        return None
    reason = reasons.get(job.array)
    if reason is None:
        reason = reasons[job.array] = Reason(
            f"array {job.array} runs {job.array_limit} jobs at once (its %{job.array_limit} limit); "
            "this one starts when one of them ends",
            "array",
            {"array": job.array, "max_running": job.array_limit},
        )
    return reason
