"""The agent's loop: report every period (and at once when a job process starts or ends or NVML
raises an XID), with the job's per-rank progress (``$MYRIAD_PROGRESS_FILE``); follow
the node's assignments by long poll, start, signal and stop job processes, forward checkpoint
reports. The control plane being unreachable changes nothing on the node: the work runs on,
reports wait in a bounded buffer and are sent in order, with backoff and jitter, when it answers."""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from pathlib import Path

from myriad_agent import __version__
from myriad_agent.client import Backoff, Client, Refused, ReportBuffer, Unreachable
from myriad_agent.config import Config, ConfigError
from myriad_agent.gpus import GPUReader
from myriad_agent.network import NetSampler
from myriad_agent.nics import discover
from myriad_agent.supervisor import Supervisor

log = logging.getLogger("myriad_agent")
POLL_WAIT_S = 20.0


class CredentialRefused(Exception):
    """The control plane refuses this node's credential (revoked or unknown): enrol again."""


def _write_private(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


class Agent:
    def __init__(self, config: Config, nvml):
        self.config = config
        config.work_dir.mkdir(parents=True, exist_ok=True)
        self.reader = GPUReader(nvml)
        self.supervisor = Supervisor(config.work_dir, config.checkpoint_root, config.log_tail_lines)
        self.buffer = ReportBuffer(config.buffer_reports)
        self.client = Client(config.server)
        self.backoff = Backoff(0.5, config.retry_max_s)
        self.retry_at = 0.0
        self.state_file = config.work_dir / "state.json"
        self.seq = (
            int(json.loads(self.state_file.read_text()).get("seq", 0)) if self.state_file.exists() else 0
        )
        self.lock = threading.Lock()
        self.assignments: dict[tuple[int, str], dict] | None = None  # None: not known yet
        self.version = -1
        self.stopping = threading.Event()
        self.refused: str | None = None
        self.checkpoint_posts: collections.deque = collections.deque(maxlen=1000)
        self.sent = 0
        ports = discover(config.sysfs_root) if config.net_interval_s > 0 else []
        self.net = NetSampler(ports, config.net_interval_s, realtime=config.net_realtime) if ports else None
        self.ports_reported: list[dict] | None = None  # the inventory the server was last sent
        self.trace_asked: dict | None = None  # an operator's request for the recorded windows
        self.trace_sent_for = 0.0  # the request the last trace answered
        self.trace_retry_at = 0.0
        self.trace_thread: threading.Thread | None = None

    # --- start ----------------------------------------------------------------------------------

    def enrol_or_load(self) -> dict:
        """This node's credential: from the work folder, else by trading the enrolment token."""
        path = self.config.credential_file
        if path.exists():
            saved = json.loads(path.read_text())
            if saved.get("server") == self.config.server:
                self.client.credential = saved["credential"]
                return saved
            log.warning(
                "the saved credential is for %s, not %s: enrolling again",
                saved.get("server"),
                self.config.server,
            )
        if not self.config.token:
            raise ConfigError("--token: this node has no credential yet; give it a one-time enrolment token")
        answer = self.client.request(
            "POST",
            "/api/v1/agent/enrol/",
            {
                "token": self.config.token,
                "hostname": self.config.hostname,
                "address": self.config.address,
                "gpus": self.reader.count,
                "agent_version": __version__,
                "ports": self.net.inventory() if self.net else [],
            },
        )
        saved = {"server": self.config.server, **answer}
        _write_private(path, saved)
        self.client.credential = answer["credential"]
        log.info("enrolled as node %s (%s GPUs)", answer["hostname"], answer["gpus"])
        return saved

    def check(self) -> dict:
        """One request with the credential: the server answers and knows this node."""
        return self.client.request("GET", "/api/v1/agent/assignments/")

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        self.reader.start_xid_watch()
        if self.net is not None:
            self.net.start()
            log.info("sampling %d network ports every %g ms", len(self.net.ports), self.net.interval_s * 1000)
        threading.Thread(target=self._poll_assignments, name="assignments", daemon=True).start()
        next_report = 0.0
        try:
            while not self.stopping.is_set() and self.refused is None:
                self.supervisor.poll()
                self._reconcile()
                now = time.time()
                urgent = self.supervisor.changed.is_set() or self.reader.xid_arrived.is_set()
                if now >= next_report or urgent:  # an XID or a process change goes out at once
                    self.supervisor.changed.clear()
                    self.reader.xid_arrived.clear()
                    self.buffer.add(self._report())
                    next_report = now + self.config.period_s
                self._flush()
                self._forward_checkpoints()
                self._send_trace()
                self.stopping.wait(0.1)
        finally:
            self.reader.stop()
            if self.net is not None:
                self.net.stop()
        if self.refused:
            log.error("the control plane refuses this node's credential: %s", self.refused)
            self.supervisor.stop_all(self.config.grace_s)
            return 3
        log.info("stopping: ending %d job processes", len(self.supervisor.running()))
        self.supervisor.stop_all(self.config.grace_s)
        self.supervisor.poll()
        self.buffer.add(self._report())
        deadline = time.time() + 5
        while len(self.buffer) and time.time() < deadline and self._flush(force=True):
            pass
        return 0

    def _report(self) -> dict:
        self.seq += 1
        _write_private(self.state_file, {"seq": self.seq})
        processes = self.supervisor.to_report(time.time())
        report = {
            "seq": self.seq,
            "sent_at": time.time(),
            "agent_version": __version__,
            "gpus": self.reader.read(),
            "xids": self.reader.take_xids(),
            "processes": [p.as_report() for p in processes],
            "progress": self.supervisor.progress(),
            "dropped": self.buffer.dropped,
        }
        if self.net is not None and self.net.count:
            ports = self.net.inventory()
            net: dict = {"ports": self.net.summary()}
            if ports != self.ports_reported:  # at start and when a port's rate changes
                net["inventory"] = ports
                self.ports_reported = ports
            report["net"] = net
        return report

    def _flush(self, force: bool = False) -> bool:
        """Send buffered reports oldest first until one fails; False when one did."""
        while (report := self.buffer.peek()) is not None:
            if not force and time.time() < self.retry_at:
                return False
            try:
                self.client.request("POST", "/api/v1/agent/report/", report)
            except Unreachable as exc:
                wait = self.backoff.next()
                self.retry_at = time.time() + wait
                log.warning(
                    "report %d not sent (%s); %d buffered, retrying in %.1f s",
                    report["seq"],
                    exc,
                    len(self.buffer),
                    wait,
                )
                return False
            except Refused as exc:
                if exc.status == 401:
                    self.refused = str(exc.body)
                    return False
                log.error("report %d refused and dropped: %s", report["seq"], exc)
            self.buffer.pop()
            self.sent += 1
            self.backoff.reset()
            self.supervisor.accepted(report["processes"], report["sent_at"])
        return True

    def _poll_assignments(self) -> None:
        backoff = Backoff(0.5, self.config.retry_max_s)
        while not self.stopping.is_set() and self.refused is None:
            try:
                answer = self.client.request(
                    "GET",
                    f"/api/v1/agent/assignments/?version={self.version}&wait={POLL_WAIT_S}",
                    timeout_s=POLL_WAIT_S + 10,
                )
            except Unreachable:
                self.stopping.wait(backoff.next())  # keep what runs; ask again later
                continue
            except Refused as exc:
                if exc.status == 401:
                    self.refused = str(exc.body)
                    return
                self.stopping.wait(backoff.next())
                continue
            backoff.reset()
            with self.lock:
                self.version = answer["version"]
                self.assignments = {(a["job"], a["generation"]): a for a in answer["assignments"]}
                self.trace_asked = answer.get("trace")

    def _reconcile(self) -> None:
        with self.lock:
            desired = self.assignments
        if desired is None:
            return
        self.supervisor.forget(desired)  # ended, heard of, no longer assigned
        self._hand_over(desired)
        for proc in self.supervisor.running():
            if proc.key not in desired:
                if proc.save_on_stop and proc.stop_deadline is None:
                    # its policy saves on demand (triggered): it saves before it is stopped
                    self.supervisor.signal(proc, self.config.checkpoint_signal)
                log.info(
                    "stopping job %d (generation %s): no longer assigned here", proc.job, proc.generation
                )
                self.supervisor.stop(proc, self.config.grace_s)
        for key, a in desired.items():
            proc = self.supervisor.processes.get(key)
            if proc is None:
                log.info(
                    "starting job %d (generation %s, rank %d of %d)",
                    a["job"],
                    a["generation"],
                    a["rank"],
                    a["nnodes"],
                )
                self.supervisor.start(a)
                continue
            asked = a.get("checkpoint_requested_at")
            if asked and asked > proc.started_at and (proc.signalled_checkpoint or 0) < asked:
                self.supervisor.signal(proc, self.config.checkpoint_signal)
                proc.signalled_checkpoint = asked
                log.info("asked job %d to save (signal %d)", proc.job, self.config.checkpoint_signal)

    def _hand_over(self, desired: dict) -> None:
        """Warm restart: a job whose placement changed and whose policy keeps healthy nodes'
        processes (``warm`` in its assignment) keeps this node's running process for the new
        placement instead of stopping it and starting another."""
        running = {
            p.job: p for p in self.supervisor.running() if p.key not in desired and p.stop_deadline is None
        }
        for key, a in desired.items():
            proc = running.get(a["job"])
            if a.get("warm") and key not in self.supervisor.processes and proc is not None:
                asked = a.get("checkpoint_requested_at")
                if asked and asked > proc.started_at and (proc.signalled_checkpoint or 0) < asked:
                    self.supervisor.signal(proc, self.config.checkpoint_signal)  # save, then move on
                    proc.signalled_checkpoint = asked
                log.info(
                    "job %d keeps its process for generation %s (rank %d of %d)",
                    a["job"],
                    a["generation"],
                    a["rank"],
                    a["nnodes"],
                )
                self.supervisor.adopt(proc, a, self.config.reconfigure_signal)

    def _send_trace(self) -> None:
        """The ports' last seconds of 10 ms windows, once per operator's request, sent from a
        thread of its own: the upload never holds up the reports (a heartbeat missed while a
        busy server takes a trace would take the node out)."""
        with self.lock:
            asked = self.trace_asked
        if asked is None or self.net is None or asked["asked_at"] <= self.trace_sent_for:
            return
        if time.time() < self.trace_retry_at or (self.trace_thread and self.trace_thread.is_alive()):
            return
        self.trace_thread = threading.Thread(
            target=self._upload_trace, args=(asked,), name="trace", daemon=True
        )
        self.trace_thread.start()

    def _upload_trace(self, asked: dict) -> None:
        trace = {"asked_at": asked["asked_at"], **self.net.trace(float(asked.get("seconds", 60)))}
        try:
            self.client.request("POST", "/api/v1/agent/trace/", trace, timeout_s=60)
        except Unreachable:
            self.trace_retry_at = time.time() + 5  # tried again in a while
            return
        except Refused as exc:
            log.error("the recorded trace was refused: %s", exc)
        self.trace_sent_for = asked["asked_at"]
        log.info("sent %d windows of the ports' trace", len(trace["t_ms"]))

    def _forward_checkpoints(self) -> None:
        """Checkpoints the job wrote to $MYRIAD_CHECKPOINT_REPORT (JSON lines), reported by rank 0."""
        with self.lock:
            desired = self.assignments or {}
        for proc in list(self.supervisor.processes.values()):
            a = desired.get(proc.key)
            if a is None or a["rank"] != 0:
                continue
            try:
                grown = proc.report_file.stat().st_size > proc.checkpoint_offset
            except FileNotFoundError:
                continue
            if not grown:  # nothing new: the file is not opened ten times a second
                continue
            with open(proc.report_file, "rb") as f:
                f.seek(proc.checkpoint_offset)
                for line in f:
                    if not line.endswith(b"\n"):
                        break
                    proc.checkpoint_offset += len(line)
                    try:
                        body = json.loads(line)
                    except ValueError:
                        log.warning(
                            "job %d wrote a checkpoint line that is not JSON: %r", proc.job, line[:200]
                        )
                        continue
                    self.checkpoint_posts.append((proc.job, body))
        while self.checkpoint_posts:
            job, body = self.checkpoint_posts[0]
            try:
                self.client.request("POST", f"/api/v1/jobs/{job}/checkpoints/", body)
            except Unreachable:
                return
            except Refused as exc:
                log.error("checkpoint of job %d refused: %s", job, exc)
            self.checkpoint_posts.popleft()
