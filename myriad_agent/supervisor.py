"""Job processes on this node: one launcher process per assigned job (``sh -c command``) in its
own process group, its output kept to a log file and a bounded tail, stopped with SIGTERM to the
group and SIGKILL after the grace period."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TAIL_EVERY_S = 60.0  # a running process's output tail is refreshed this often
PROGRESS_WINDOW = 8  # compute times of the newest steps a report carries
PROGRESS_READ_MAX = 1 << 20  # bytes of new progress lines read per report


@dataclass
class Process:
    job: int
    generation: str
    popen: subprocess.Popen | None
    log: Path
    report_file: Path
    started_at: float
    state: str = "running"  # running, exited, failed_to_start
    exit_code: int | None = None
    ended_at: float | None = None
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    stop_deadline: float | None = None  # when SIGKILL follows the SIGTERM already sent
    signalled_checkpoint: float | None = None
    reported: str | None = None  # the state the control plane has accepted from us
    reported_tail_at: float = 0.0  # when its output tail was last sent
    checkpoint_offset: int = 0
    save_on_stop: bool = False  # its policy saves on demand: the checkpoint signal before SIGTERM
    adopted_from: str | None = None  # the generation it ran under before a warm restart
    progress_file: Path | None = None
    progress_offset: int = 0
    step: int | None = None  # the newest step the rank's compute finished ($MYRIAD_PROGRESS_FILE)
    step_at: float = 0.0  # when it moved
    compute_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=PROGRESS_WINDOW))

    @property
    def key(self) -> tuple[int, str]:
        return (self.job, self.generation)

    def as_report(self, tail_chars: int = 8000) -> dict:
        out = {
            "job": self.job,
            "generation": self.generation,
            "state": self.state,
            "started_at": self.started_at,
            "log_tail": "".join(self.tail)[-tail_chars:],
        }
        if self.popen is not None:
            out["pid"] = self.popen.pid
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.ended_at is not None:
            out["ended_at"] = self.ended_at
        if self.adopted_from is not None:
            out["adopted_from"] = self.adopted_from
        return out


class Supervisor:
    def __init__(self, work_dir: Path, checkpoint_root: Path, tail_lines: int = 200):
        self.work_dir, self.checkpoint_root, self.tail_lines = work_dir, checkpoint_root, tail_lines
        self.processes: dict[tuple[int, str], Process] = {}
        self.lock = threading.RLock()
        self.changed = threading.Event()  # a process started or ended: report soon

    def start(self, assignment: dict, base_env: dict | None = None) -> Process:
        job, generation = assignment["job"], assignment["generation"]
        folder = self.work_dir / "jobs" / f"{job}-{generation}"
        folder.mkdir(parents=True, exist_ok=True)
        checkpoints = self.checkpoint_root / str(job)
        checkpoints.mkdir(parents=True, exist_ok=True)
        env = {**(base_env if base_env is not None else os.environ), **assignment["env"]}
        env["MYRIAD_CHECKPOINT_DIR"] = str(checkpoints)
        env["MYRIAD_CHECKPOINT_REPORT"] = str(folder / "checkpoints.jsonl")
        env["MYRIAD_PROGRESS_FILE"] = str(folder / "progress.jsonl")
        env["MYRIAD_ASSIGNMENT_FILE"] = str(self._assignment_file(job))
        _write_json(self._assignment_file(job), assignment)
        log = folder / "output.log"
        proc = Process(job, generation, None, log, folder / "checkpoints.jsonl", time.time())
        proc.progress_file = folder / "progress.jsonl"
        proc.save_on_stop = bool(assignment.get("save_on_stop"))
        proc.tail = collections.deque(maxlen=self.tail_lines)
        try:
            out = open(log, "ab")  # noqa: SIM115 - handed to the reader thread, closed there
            proc.popen = subprocess.Popen(
                ["/bin/sh", "-c", assignment["command"]],
                env=env,
                cwd=folder,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: signals reach every child
            )
        except OSError as exc:
            proc.state, proc.ended_at = "failed_to_start", time.time()
            proc.tail.append(f"could not start: {exc}\n")
        else:
            threading.Thread(target=self._read, args=(proc, out), daemon=True, name=f"job-{job}").start()
        with self.lock:
            self.processes[proc.key] = proc
        self.changed.set()
        return proc

    def _read(self, proc: Process, out) -> None:
        with out:
            for line in iter(proc.popen.stdout.readline, b""):
                out.write(line)
                out.flush()
                proc.tail.append(line.decode(errors="replace"))
        proc.popen.stdout.close()

    def poll(self) -> None:
        """Collect exits and send SIGKILL where the grace period ran out."""
        now = time.time()
        with self.lock:
            for proc in self.processes.values():
                if proc.state != "running":
                    continue
                code = proc.popen.poll()
                if code is not None:
                    proc.state, proc.exit_code, proc.ended_at = "exited", code, now
                    self.changed.set()
                elif proc.stop_deadline is not None and now >= proc.stop_deadline:
                    _signal_group(proc.popen, signal.SIGKILL)

    def _assignment_file(self, job: int) -> Path:
        return self.work_dir / "jobs" / f"{job}-assignment.json"

    def adopt(self, proc: Process, assignment: dict, sig: int) -> None:
        """Warm restart: the running process of an older placement serves the new one. Its new
        assignment (peers, rank, world size) goes to $MYRIAD_ASSIGNMENT_FILE and the process gets
        ``sig`` to read it and rebuild its communicators; it is reported under the new
        generation, naming the old one."""
        with self.lock:
            self.processes.pop(proc.key, None)
            proc.adopted_from, proc.generation = proc.generation, assignment["generation"]
            proc.save_on_stop = bool(assignment.get("save_on_stop"))
            proc.reported = None
            self.processes[proc.key] = proc
        _write_json(self._assignment_file(proc.job), assignment)
        self.signal(proc, sig)
        self.changed.set()

    def stop(self, proc: Process, grace_s: float) -> None:
        """SIGTERM to the process group now, SIGKILL after ``grace_s`` if it is still there."""
        if proc.state != "running" or proc.stop_deadline is not None:
            return
        _signal_group(proc.popen, signal.SIGTERM)
        proc.stop_deadline = time.time() + grace_s

    def signal(self, proc: Process, sig: int) -> None:
        if proc.state == "running":
            _signal_group(proc.popen, sig)

    def running(self) -> list[Process]:
        with self.lock:
            return [p for p in self.processes.values() if p.state == "running"]

    def to_report(self, now: float, tail_every_s: float = TAIL_EVERY_S) -> list[Process]:
        """Processes the control plane must hear about: each one whose state it has not accepted
        yet (started, ended), and a running one whose output tail was last sent ``tail_every_s``
        ago. Unchanged processes stay out, so nearly every report carries readings only."""
        with self.lock:
            return [
                p
                for p in self.processes.values()
                if p.state != p.reported
                or (p.state == "running" and now - p.reported_tail_at >= tail_every_s)
            ]

    def progress(self) -> list[dict]:
        """Each running rank's progress: the job appends one JSON line per step to
        $MYRIAD_PROGRESS_FILE, ``{"step": N, "compute_s": S}`` (N: the step whose forward and
        backward finished on this rank, written before the step's gradient collective; S: that
        compute's seconds). Read from where the last read stopped; a line that is not JSON, or a
        half-written one, is skipped or waited for."""
        out = []
        for proc in self.running():
            _read_progress(proc)
            if proc.step is not None:
                out.append(
                    {
                        "job": proc.job,
                        "generation": proc.generation,
                        "step": proc.step,
                        "step_at": proc.step_at,
                        "recent": list(proc.compute_s),
                    }
                )
        return out

    def accepted(self, sent: list[dict], at: float) -> None:
        """A report carrying these process states was accepted."""
        with self.lock:
            for entry in sent:
                proc = self.processes.get((entry["job"], entry["generation"]))
                if proc is not None:
                    proc.reported = entry["state"]
                    proc.reported_tail_at = at

    def forget(self, keep) -> None:
        """Drop ended processes the control plane has heard about and that are not in ``keep``."""
        with self.lock:
            for key in [
                k for k, p in self.processes.items() if p.state != "running" and p.reported == p.state
            ]:
                if key not in keep:
                    del self.processes[key]

    def stop_all(self, grace_s: float) -> None:
        for proc in self.running():
            self.stop(proc, grace_s)
        deadline = time.time() + grace_s + 5
        while self.running() and time.time() < deadline:
            self.poll()
            time.sleep(0.1)


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(popen.pid, sig)


def _read_progress(proc: Process) -> None:
    path = proc.progress_file
    try:
        if path is None or path.stat().st_size <= proc.progress_offset:
            return
        with open(path, "rb") as f:
            f.seek(proc.progress_offset)
            chunk = f.read(PROGRESS_READ_MAX)
    except FileNotFoundError:
        return
    now = time.time()
    for line in chunk.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # written halfway: read it next time
        proc.progress_offset += len(line)
        try:
            body = json.loads(line)
            step, compute = int(body["step"]), float(body.get("compute_s", 0.0))
        except (ValueError, KeyError, TypeError):
            continue
        if proc.step is None or step > proc.step:
            proc.step, proc.step_at = step, now
            if compute > 0:
                proc.compute_s.append(round(compute, 4))


def _write_json(path: Path, body: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)  # the job never reads half a file
