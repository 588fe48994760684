"""Reading the Alibaba GPU cluster trace v2023 ("openb", Weng et al., USENIX ATC'23; Apache-2.0
copy in hkust-adsl/kubernetes-scheduler-simulator): a node list and a task (pod) list.

Node columns: sn, cpu_milli, memory_mib, gpu, model. Task columns: name, cpu_milli, memory_mib,
num_gpu, gpu_milli, gpu_spec (allowed models joined by '|'), then optional qos, phase and times;
tasks are returned in creation-time order when the list has creation times. A task that asks
for GPUs but no GPU capacity (``gpu_milli`` 0) is CPU-only, as the FGD simulator treats it.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from engine.packing import MAX_GPUS_PER_NODE, WHOLE, Nodes, Task


class TraceError(ValueError):
    """A row of a trace file is malformed; the message names the file, line and column."""


def _int(row: dict, column: str, where: str) -> int:
    value = row.get(column)
    try:
        return int(float(value))
    except (TypeError, ValueError):
        raise TraceError(f"{where}: column {column} must be a number, got {value!r}") from None


def load_nodes(path: str | Path, *, gpu_only: bool = True) -> Nodes:
    path = Path(path)
    names, cpu, mem, gpus, model = [], [], [], [], []
    models: list[str] = []
    with path.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            where = f"{path.name} line {line}"
            n = _int(row, "gpu", where)
            if n > MAX_GPUS_PER_NODE or n < 0:
                raise TraceError(f"{where}: column gpu must be 0-{MAX_GPUS_PER_NODE}, got {n}")
            if gpu_only and n == 0:
                continue
            name = (row.get("model") or "").strip() or "cpu"
            if name not in models:
                models.append(name)
            names.append(row.get("sn") or f"node-{line}")
            cpu.append(_int(row, "cpu_milli", where))
            mem.append(_int(row, "memory_mib", where))
            gpus.append(n)
            model.append(models.index(name))
    if not names:
        raise TraceError(f"{path.name}: no nodes")
    return Nodes(names, np.array(cpu), np.array(mem), np.array(gpus), np.array(model), models)


def load_tasks(path: str | Path) -> list[Task]:
    path = Path(path)
    rows = []
    with path.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            where = f"{path.name} line {line}"
            gpus = _int(row, "num_gpu", where)
            milli = _int(row, "gpu_milli", where) if gpus else 0
            if gpus < 0 or not 0 <= milli <= WHOLE:
                raise TraceError(f"{where}: num_gpu must be >= 0 and gpu_milli 0-1000")
            if gpus > 1 and milli != WHOLE:
                raise TraceError(f"{where}: a task with {gpus} GPUs must take them whole (gpu_milli 1000)")
            if milli == 0:
                gpus = 0  # no GPU capacity asked for: a CPU-only task, as the simulator treats it
            spec = tuple(m for m in (row.get("gpu_spec") or "").split("|") if m)
            created = row.get("creation_time")
            order = float(created) if created not in (None, "") else float(line)
            task = Task(
                row.get("name") or f"task-{line}",
                _int(row, "cpu_milli", where),
                _int(row, "memory_mib", where),
                gpus,
                milli,
                spec,
            )
            rows.append((order, line, task))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [t for _, _, t in rows]
