"""Real nodes end to end: a running stack (``manage.py runstack``: ASGI server, Celery worker and
beat; on the embedded default or PostgreSQL + Redis) and four ``myriad-agent`` processes with
the fake NVML, each enrolled with a one-time token. Jobs are real commands started by the agents;
the tests follow them through the API as an operator would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from myriad_agent import fake_sysfs
from tests.browser_stack import ROOT, start_stack, stop_group

GPUS_PER_NODE = 2
TOPOLOGY = {
    "regions": [
        {
            "name": "lab",
            "datacenters": [
                {
                    "name": "dc1",
                    "pods": [
                        {
                            "name": "p1",
                            "chip_type": "H100-SXM",
                            "racks": 1,
                            "nodes_per_rack": 4,
                            "gpus_per_node": GPUS_PER_NODE,
                        }
                    ],
                }
            ],
        }
    ]
}
LAUNCH_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NODE_RANK",
    "NNODES",
    "LOCAL_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "MYRIAD_JOB_ID",
    "MYRIAD_CHECKPOINT_DIR",
    "MYRIAD_ARRAY_ID",
    "MYRIAD_ARRAY_INDEX",
)
# a job: prints its launch environment, writes its pid, then sleeps SLEEP seconds and exits CODE
JOB = (
    f'{sys.executable} -c "import os, time; '
    f"print(' '.join(k + '=' + os.environ.get(k, '-') for k in {list(LAUNCH_VARIABLES)!r}), flush=True); "
    "d = os.environ['MYRIAD_CHECKPOINT_DIR']; "
    "open(os.path.join(d, 'pid-' + os.environ['NODE_RANK'] + '-' + os.environ['MYRIAD_GENERATION']), 'w')"
    ".write(str(os.getpid())); "
    "time.sleep(float(os.environ['SLEEP'])); print('bye', flush=True); "
    "raise SystemExit(int(os.environ['CODE']))\""
)


class Api:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def call(self, method: str, path: str, body=None):
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode() if body is not None else None, method=method
        )
        req.add_header("Authorization", f"Token {self.token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def get(self, path: str):
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body)
        return body


class Agent:
    def __init__(self, hostname: str, folder: Path, server: str, token: str):
        self.hostname, self.folder = hostname, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.state = folder / "nvml.json"
        self.state.write_text(json.dumps({"gpus": GPUS_PER_NODE, "util": 30, "uuid": f"GPU-{hostname}"}))
        self.sysfs = folder / "sysfs"  # one 400 Gb/s RDMA port per GPU, as on a rail-optimized node
        self.ports = fake_sysfs.build(self.sysfs, ib_ports=GPUS_PER_NODE)
        self.nics = fake_sysfs.FakePorts(self.sysfs)
        self.log = open(folder / "agent.log", "ab")  # noqa: SIM115 - kept for failures
        args = [
            sys.executable,
            "-m",
            "myriad_agent",
            "--server",
            server,
            "--token",
            token,
            "--hostname",
            hostname,
            "--address",
            "127.0.0.1",
            "--work-dir",
            str(folder / "work"),
            "--period",
            "1",
            "--grace",
            "3",
            "--retry-max",
            "2",
            "--nvml",
            f"fake:{self.state}",
            "--sysfs-root",
            str(self.sysfs),
        ]
        self.process = subprocess.Popen(
            args, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def inject_xid(self, gpu: int, xid: int) -> None:
        with open(f"{self.state}.xids", "a") as f:
            f.write(json.dumps({"gpu": gpu, "xid": xid}) + "\n")

    def pids(self, job: int) -> dict[str, int]:
        folder = self.folder / "work" / "checkpoints" / str(job)
        return {p.name: int(p.read_text()) for p in folder.glob("pid-*")} if folder.exists() else {}

    def seq(self) -> int:
        return json.loads((self.folder / "work" / "state.json").read_text())["seq"]

    def traffic(self, seconds: float) -> subprocess.Popen:
        """A training job's bursts on this node's ports (each second: 150 ms near line rate)."""
        return subprocess.Popen(
            [sys.executable, "-m", "myriad_agent.fake_sysfs", str(self.sysfs), "--seconds", str(seconds)],
            cwd=ROOT,
            start_new_session=True,
        )

    def stop(self) -> None:
        stop_group(self.process)
        self.nics.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(what: str, check, timeout: float = 60.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real-nodes")
    topology = folder / "topology.json"
    topology.write_text(json.dumps(TOPOLOGY))
    stack = start_stack(
        folder / "stack",
        str(topology),
        simulated_fleet=False,
        name="agents",
        extra_env={
            "MYRIAD_AGENT_WATCH_INTERVAL_S": "1",
            "MYRIAD_LAUNCH_READY_TIMEOUT_S": "60",
            "MYRIAD_CYCLE_INTERVAL_S": "1",
            "MYRIAD_PROGRESS_HANG_FLOOR_S": "3",
            "MYRIAD_FABRIC_CONGESTION_MIN_S": "2",
        },
    )
    api = Api(stack.url, stack.tokens["operator"])
    agents = {}
    try:
        for node in api.get("/api/v1/nodes/?ordering=id")["results"]:
            status, made = api.call("POST", "/api/v1/enrolment-tokens/", {"node": node["hostname"]})
            assert status == 201, made
            agents[node["hostname"]] = Agent(
                node["hostname"], folder / node["hostname"], stack.url, made["token"]
            )
        wait_for(
            "every agent's first report",
            lambda: (
                all(c["last_seq"] > 0 for c in api.get("/api/v1/node-credentials/")["results"])
                and len(api.get("/api/v1/node-credentials/")["results"]) == len(agents)
            ),
        )
        yield stack, api, agents
    finally:
        for agent in agents.values():
            agent.stop()
        stack.stop()


@pytest.fixture(autouse=True)
def idle_after(cluster):
    """Every test leaves the shared cluster idle: one that fails midway would leave its job on
    the nodes, and each test after it would fail for want of nodes, hiding what went wrong."""
    yield
    _, api, _ = cluster
    for state in ("pending", "running"):
        for job in api.get(f"/api/v1/jobs/?state={state}&page_size=200")["results"]:
            api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {"reason": "the test ended"})


def node_of(api: Api, hostname: str) -> dict:
    return next(n for n in api.get("/api/v1/nodes/?page_size=100")["results"] if n["hostname"] == hostname)


def submit(api: Api, sleep: float, code: int = 0, gpus: int = 2 * GPUS_PER_NODE, **extra) -> dict:
    body = {
        "queue": "pretrain",
        "gpus": gpus,
        "chip_types": ["H100-SXM"],
        "topology": "pod",
        "command": JOB,
        "env": {"SLEEP": str(sleep), "CODE": str(code)},
        **extra,
    }
    status, job = api.call("POST", "/api/v1/jobs/", body)
    assert status == 201, job
    return job


def job_state(api: Api, job: dict, *states: str):
    def check():
        detail = api.get(f"/api/v1/jobs/{job['id']}/")
        return detail if detail["state"] in states else None

    return check


def launched(api: Api, job: dict, times: int = 1):
    def check():
        detail = api.get(f"/api/v1/jobs/{job['id']}/")
        events = [e for e in detail["events"] if e["kind"] == "launched"]
        return detail if len(events) >= times and detail["state"] == "running" else None

    return check


def relaunched(api: Api, job: dict, since: str):
    """The job running on every rank of a placement other than generation ``since`` (counting
    launched events would also count a move that happened before the step under test)."""

    def check():
        detail = api.get(f"/api/v1/jobs/{job['id']}/")
        now = detail["launched_generation"]
        return detail if detail["state"] == "running" and now and now != since else None

    return check


def current_nodes(detail: dict) -> set[str]:
    """The nodes running the job's current placement (an older one may still be ending)."""
    return {
        p["node"]
        for p in detail["processes"]
        if p["state"] == "running" and p["generation"] == detail["launched_generation"]
    }


def test_a_two_node_job_runs_as_real_processes_with_the_launch_environment(cluster):
    _, api, agents = cluster
    job = submit(api, sleep=2)
    detail = wait_for("the job to finish", job_state(api, job, "finished", "failed"), timeout=90)
    assert detail["state"] == "finished", detail["pending_reason"]
    procs = sorted(detail["processes"], key=lambda p: p["rank"])
    assert [(p["rank"], p["state"], p["exit_code"]) for p in procs] == [(0, "exited", 0), (1, "exited", 0)]
    master_port = None
    for p in procs:
        printed = dict(kv.split("=", 1) for kv in p["log_tail"].splitlines()[0].split())
        assert printed["MASTER_ADDR"] == "127.0.0.1" and printed["WORLD_SIZE"] == str(2 * GPUS_PER_NODE)
        assert printed["RANK"] == printed["NODE_RANK"] == str(p["rank"]) and printed["NNODES"] == "2"
        assert printed["LOCAL_WORLD_SIZE"] == str(GPUS_PER_NODE) and printed["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert printed["MYRIAD_JOB_ID"] == str(job["id"])
        node_folder = agents[p["node"]].folder
        assert printed["MYRIAD_CHECKPOINT_DIR"] == str(node_folder / "work" / "checkpoints" / str(job["id"]))
        assert 20000 <= int(printed["MASTER_PORT"]) < 40000 and master_port in (None, printed["MASTER_PORT"])
        master_port = printed["MASTER_PORT"]
        assert p["log_tail"].rstrip().endswith("bye")
    kinds = [e["kind"] for e in detail["events"]]
    assert kinds.index("admitted") < kinds.index("launched") < kinds.index("finished")


def test_a_failing_command_fails_the_job_with_its_exit_code(cluster):
    _, api, _ = cluster
    job = submit(api, sleep=0.5, code=7, gpus=GPUS_PER_NODE, topology="node")
    detail = wait_for("the job to fail", job_state(api, job, "failed", "finished"), timeout=60)
    assert detail["state"] == "failed"
    reason = next(e["reason"] for e in detail["events"] if e["kind"] == "failed")
    assert "exit code 7" in reason and "bye" in reason


def test_an_arrays_jobs_run_at_most_its_limit_at_once_and_each_reads_its_index(cluster):
    _, api, _ = cluster
    status, array = api.call(
        "POST",
        "/api/v1/jobs/",
        {
            "queue": "pretrain",
            "gpus": GPUS_PER_NODE,
            "chip_types": ["H100-SXM"],
            "topology": "node",
            "command": JOB,
            "env": {"SLEEP": "2", "CODE": "0"},
            "array": "0-3%2",
        },
    )
    assert status == 201 and array["size"] == 4 and array["max_running"] == 2, array

    def all_ended():
        jobs = api.get(f"/api/v1/jobs/?array={array['id']}&ordering=id")["results"]
        return jobs if len(jobs) == 4 and all(j["state"] in ("finished", "failed") for j in jobs) else None

    jobs = wait_for("every job of the array to end", all_ended, timeout=120)
    assert [j["array_index"] for j in jobs] == [0, 1, 2, 3]
    spans = []
    for job in jobs:
        detail = api.get(f"/api/v1/jobs/{job['id']}/")
        assert detail["state"] == "finished", detail["pending_reason"]
        printed = dict(kv.split("=", 1) for kv in detail["processes"][0]["log_tail"].splitlines()[0].split())
        assert printed["MYRIAD_ARRAY_ID"] == str(array["id"])
        assert printed["MYRIAD_ARRAY_INDEX"] == str(job["array_index"])
        spans.append(
            (datetime.fromisoformat(detail["started_at"]), datetime.fromisoformat(detail["finished_at"]))
        )
    # four nodes were free, but never more than two of the array's jobs ran at once (its %2)
    at_once = max(sum(1 for s, f in spans if s <= t < f) for t, _ in spans)
    assert at_once == 2
    assert api.get(f"/api/v1/arrays/{array['id']}/")["states"]["finished"] == 4


def test_cancel_and_preemption_kill_the_real_processes(cluster):
    _, api, agents = cluster
    job = submit(api, sleep=600)
    detail = wait_for("every rank running", launched(api, job), timeout=60)
    pids = wait_for(
        "both pid files",
        lambda: (
            [pid for a in agents.values() for pid in a.pids(job["id"]).values()]
            if sum(len(a.pids(job["id"])) for a in agents.values()) == 2
            else None
        ),
    )
    assert all(alive(pid) for pid in pids)
    status, _ = api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {"reason": "test"})
    assert status == 200
    wait_for("the processes to end", lambda: not any(alive(pid) for pid in pids), timeout=30)

    # a drain preempts the job: its processes end and it runs again on other nodes
    job = submit(api, sleep=600)
    detail = wait_for("every rank running", launched(api, job), timeout=60)
    generation = detail["launched_generation"]
    first = current_nodes(detail)
    pids = wait_for(
        "both pid files",
        lambda: (
            [pid for h in first for pid in agents[h].pids(job["id"]).values()]
            if sum(len(agents[h].pids(job["id"])) for h in first) == 2
            else None
        ),
    )
    drained = sorted(first)[0]
    node_id = next(n["id"] for n in api.get("/api/v1/nodes/")["results"] if n["hostname"] == drained)
    status, _ = api.call("POST", f"/api/v1/nodes/{node_id}/drain/", {"reason": "maintenance"})
    assert status == 200
    wait_for("the old processes to end", lambda: not any(alive(pid) for pid in pids), timeout=30)
    detail = wait_for("the job running again", relaunched(api, job, generation), timeout=90)
    assert any(e["kind"] == "preempted" for e in detail["events"])
    now_on = current_nodes(detail)
    assert drained not in now_on and len(now_on) == 2
    status, _ = api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {})
    api.call("POST", f"/api/v1/nodes/{node_id}/uncordon/", {})
    wait_for(
        "the node back",
        lambda: (
            next(n for n in api.get("/api/v1/nodes/")["results"] if n["id"] == node_id)["state"] == "ready"
        ),
        timeout=30,
    )


# a synchronous training job in miniature: each rank "computes" for STEP_S (times SLOW on rank
# SLOW_RANK), appends its step to $MYRIAD_PROGRESS_FILE, then waits for every rank to reach the
# step (the collective, through files in SYNC_DIR); rank HANG_RANK stops at step HANG_AT and sleeps
TRAINER = r"""
import json, os, time
rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
sync, progress = os.environ["SYNC_DIR"], os.environ["MYRIAD_PROGRESS_FILE"]
slow = float(os.environ.get("SLOW", "1")) if rank == int(os.environ.get("SLOW_RANK", "-1")) else 1.0
step = 0
while True:
    if rank == int(os.environ.get("HANG_RANK", "-1")) and step >= int(os.environ["HANG_AT"]):
        time.sleep(3600)  # its local work stopped; the process stays
    compute = float(os.environ["STEP_S"]) * slow
    time.sleep(compute)
    with open(progress, "a") as f:
        f.write(json.dumps({"step": step, "compute_s": compute}) + "\n")
    with open(os.path.join(sync, f"{rank}.tmp"), "w") as f:
        f.write(str(step))
    os.replace(os.path.join(sync, f"{rank}.tmp"), os.path.join(sync, str(rank)))
    def reached(r):
        try:
            return int(open(os.path.join(sync, str(r))).read()) >= step
        except (FileNotFoundError, ValueError):
            return False
    while not all(reached(r) for r in range(world)):
        time.sleep(0.02)
    step += 1
"""


def train(api: Api, folder: Path, name: str, policy: str | None = None, **env) -> dict:
    script, sync = folder / "trainer.py", folder / f"sync-{name}"
    script.write_text(TRAINER)
    sync.mkdir()
    body = {
        "queue": "pretrain",
        "gpus": 2 * GPUS_PER_NODE,
        "chip_types": ["H100-SXM"],
        "topology": "pod",
        "command": f"{sys.executable} {script}",
        "env": {"SYNC_DIR": str(sync), "STEP_S": "0.2", **{k: str(v) for k, v in env.items()}},
        **({"checkpoint_policy": policy} if policy else {}),
    }
    status, job = api.call("POST", "/api/v1/jobs/", body)
    assert status == 201, job
    return job


def test_a_rank_that_stops_making_progress_is_named_as_a_hang_and_the_job_restarts(cluster, tmp_path):
    _, api, agents = cluster
    storm = threading.Event()

    def cnp_storm():  # every node's first NIC sends ~20,000 CNPs a second while the job runs
        ports = [(fake_sysfs.FakePorts(a.sysfs), a.ports[0]) for a in agents.values()]
        while not storm.is_set():
            for nics, port in ports:
                nics.add(port, "np_cnp_sent", 1000)
            time.sleep(0.05)
        for nics, _ in ports:
            nics.close()

    threading.Thread(target=cnp_storm, daemon=True).start()
    job = train(api, tmp_path, "hang", HANG_RANK=1, HANG_AT=15)
    try:
        detail = wait_for("every rank running", launched(api, job), timeout=60)
        rank1 = next(p["node"] for p in detail["processes"] if p["state"] == "running" and p["rank"] == 1)
        fault = wait_for(
            "the hang found from progress",
            lambda: next(
                (
                    f
                    for f in api.get("/api/v1/faults/?source=job_hang")["results"]
                    if f"job {job['id']}:" in f["description"] and f["action"]
                ),
                None,
            ),
            timeout=60,
        )
    finally:
        storm.set()
        api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {})
    assert fault["hostname"] == rank1  # the rank that stopped, not the one waiting for it
    assert "stopped before step 15" in fault["description"]
    # its node's ports show the evidence (the job page lists the fault with this description)
    assert "CNP storm" in fault["description"] and "CNP storm" in fault["data"]["network_evidence"]
    assert fault["action"] == "restart_job" and fault["job"] == job["id"]
    # the server asked the hung node for its last minute of 10 ms windows: the trace comes
    node = node_of(api, rank1)
    trace = wait_for(
        "the hung node's trace",
        lambda: (api.call("GET", f"/api/v1/nodes/{node['id']}/ports/trace/")[1] or {}).get("t_ms"),
        timeout=40,
    )
    assert len(trace) > 100


def test_a_slow_rank_is_named_a_straggler_and_cordoned_by_its_policy(cluster, tmp_path):
    _, api, _ = cluster
    status, policy = api.call(
        "POST",
        "/api/v1/checkpoint-policies/",
        {
            "name": "cordon-slow",
            "kind": "async",
            "recovery_tier": "fast_detection",
            "cordon_stragglers": True,
        },
    )
    assert status == 201, policy
    job = train(api, tmp_path, "slow", policy="cordon-slow", SLOW_RANK=0, SLOW=2.5)
    detail = wait_for("every rank running", launched(api, job), timeout=60)
    rank0 = next(p["node"] for p in detail["processes"] if p["state"] == "running" and p["rank"] == 0)
    event = wait_for(
        "the straggler event",
        lambda: next(
            (e for e in api.get(f"/api/v1/jobs/{job['id']}/")["events"] if e["kind"] == "straggler"), None
        ),
        timeout=60,
    )
    assert event["data"]["node"] == rank0 and event["data"]["slowdown"] > 1.3 and event["data"]["cordoned"]
    node = next(n for n in api.get("/api/v1/nodes/")["results"] if n["hostname"] == rank0)
    assert node["state"] == "cordoned" and "straggler" in node["state_reason"]
    assert api.get(f"/api/v1/jobs/{job['id']}/")["state"] == "running"  # running work stays
    api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {})
    status, _ = api.call("POST", f"/api/v1/nodes/{node['id']}/uncordon/", {"reason": "looked at it"})
    assert status == 200


# a job that follows warm restarts: on the reconfigure signal it reads its new placement and
# records it in its checkpoint folder; on the checkpoint signal it "saves" (a file per rank)
WARM_JOB = r"""
import json, os, signal, time
def reconfigure(*_):
    a = json.load(open(os.environ["MYRIAD_ASSIGNMENT_FILE"]))
    with open(os.path.join(os.environ["MYRIAD_CHECKPOINT_DIR"], "reconfigured"), "a") as f:
        f.write(f"{a['generation']} {a['rank']} {a['nnodes']} {a['env']['MASTER_ADDR']}\n")
def save(*_):
    name = "saved-" + os.environ["NODE_RANK"]
    with open(os.path.join(os.environ["MYRIAD_CHECKPOINT_DIR"], name), "w") as f:
        f.write(os.environ["MYRIAD_GENERATION"])
leaving = []
signal.signal(signal.SIGUSR2, reconfigure)
signal.signal(signal.SIGUSR1, save)
# a trainer finishes what it does, then leaves: the stop that follows a save right away lands while
# the save runs, and exiting from its handler there would cut the save short
signal.signal(signal.SIGTERM, lambda *_: leaving.append(True))
open(os.path.join(os.environ["MYRIAD_CHECKPOINT_DIR"], "ready-" + os.environ["NODE_RANK"]), "w").close()
while not leaving:
    time.sleep(0.2)
"""


def test_a_warm_restart_saves_keeps_the_healthy_nodes_process_and_tells_it_the_new_placement(
    cluster, tmp_path
):
    _, api, agents = cluster
    status, _ = api.call(
        "POST",
        "/api/v1/checkpoint-policies/",
        {"name": "warm", "kind": "triggered", "recovery_tier": "warm_restart"},
    )
    assert status == 201
    script = tmp_path / "warm.py"
    script.write_text(WARM_JOB)
    body = {
        "queue": "pretrain",
        "gpus": 2 * GPUS_PER_NODE,
        "chip_types": ["H100-SXM"],
        "topology": "pod",
        "command": f"exec {sys.executable} {script}",  # the signals reach the trainer, not a shell
        "checkpoint_policy": "warm",
    }
    status, job = api.call("POST", "/api/v1/jobs/", body)
    assert status == 201, job
    detail = wait_for("every rank running", launched(api, job), timeout=60)
    first = detail["launched_generation"]
    ranks = {p["rank"]: p for p in detail["processes"] if p["generation"] == first}
    healthy, victim = ranks[0], ranks[1]
    for node, rank in ((healthy["node"], 0), (victim["node"], 1)):  # its signal handlers are in place
        ready = agents[node].folder / "work" / "checkpoints" / str(job["id"]) / f"ready-{rank}"
        wait_for(f"rank {rank} ready", ready.exists, timeout=30)
    # a maintenance notice: the node leaves, its memory is still readable, so a triggered save runs
    node_id = next(n["id"] for n in api.get("/api/v1/nodes/")["results"] if n["hostname"] == victim["node"])
    status, made = api.call("POST", "/api/v1/faults/", {"node": node_id, "source": "host_maintenance"})
    assert status == 201, made
    detail = wait_for("the job running again on a replacement", relaunched(api, job, first), timeout=90)
    now = detail["launched_generation"]
    assert victim["node"] not in current_nodes(detail), detail["events"]
    kept = next(p for p in detail["processes"] if p["node"] == healthy["node"] and p["generation"] == now)
    assert kept["pid"] == healthy["pid"]  # the same process, not a new one
    told = agents[healthy["node"]].folder / "work" / "checkpoints" / str(job["id"]) / "reconfigured"
    line = wait_for("the new placement handed to the job", lambda: told.exists() and told.read_text())
    generation, _, nnodes, _ = line.split()
    assert generation == now and nnodes == "2"
    for node, rank in ((healthy["node"], 0), (victim["node"], 1)):  # both ranks saved at the fault
        saved = agents[node].folder / "work" / "checkpoints" / str(job["id"]) / f"saved-{rank}"
        assert wait_for(f"rank {rank}'s triggered save", saved.exists, timeout=45)
    api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {})


# --- the network: ports sampled every 10 ms by the agents -----------------------------------


def test_bursts_a_10_s_mean_hides_show_in_p99_and_open_a_congestion_record(cluster):
    _, api, agents = cluster
    agent = agents[sorted(agents)[0]]
    node = node_of(api, agent.hostname)
    ports = api.get(f"/api/v1/nodes/{node['id']}/ports/")["ports"]
    assert [p["name"] for p in ports] == agent.ports and ports[0]["rate_gbps"] == 400
    driver = agent.traffic(60)
    try:

        def bursty():
            latest = api.get(f"/api/v1/nodes/{node['id']}/ports/")["ports"][0]["latest"]
            # a report sent before the sampler's first window has no utilization yet
            return latest if latest and latest["windows"] >= 50 and latest["util"]["p99"] > 90 else None

        latest = wait_for("a report with the bursts in its p99", bursty, timeout=30)
        assert latest["util"]["mean"] < 40 and latest["bursts"] > 0  # a mean would call it a quiet link
        record = wait_for(
            "a congestion record on the node's rail leaf",
            lambda: next(  # the bursts' record (an earlier test's CNPs may have opened another)
                (
                    r
                    for r in api.get("/api/v1/congestion/?open=true")["results"]
                    if r["rail"] is not None and r["peak_p99"] > 90
                ),
                None,
            ),
            timeout=30,
        )
        assert record["rail"] in (0, 1) and record["peak_p99"] > 90 and record["source"] == "agents"
        fabric = api.get("/api/v1/telemetry/fabric/")
        assert fabric["source"] == "agents" and fabric["leaf"]["congested"]
    finally:
        stop_group(driver)
    closed = wait_for(  # the traffic stopped: the next reports are quiet and the record closes
        "the congestion record to close",
        lambda: (r := api.get(f"/api/v1/congestion/{record['id']}/"))["ended_at"] and r,
        timeout=30,
    )
    assert closed["ended_at"] > closed["started_at"]


def test_a_recorded_trace_comes_from_the_agent(cluster):
    _, api, agents = cluster
    agent = agents[sorted(agents)[0]]
    node = node_of(api, agent.hostname)
    status, asked = api.call("POST", f"/api/v1/nodes/{node['id']}/ports/record/", {"seconds": 5})
    assert status == 202, asked
    trace = wait_for(  # the agent sees the request with its next poll of its assignments (<= 20 s)
        "the trace",
        lambda: (api.call("GET", f"/api/v1/nodes/{node['id']}/ports/trace/")[1] or {}).get("t_ms"),
        timeout=40,
    )
    body = api.get(f"/api/v1/nodes/{node['id']}/ports/trace/")
    assert len(trace) >= 400 and body["interval_ms"] == 10  # ~500 windows of 10 ms
    assert [p["port"] for p in body["ports"]] == agent.ports


def test_a_flapping_port_cordons_its_node(cluster):
    _, api, agents = cluster
    agent = agents[sorted(agents)[2]]
    for _ in range(3):
        agent.nics.flap(agent.ports[1])
        time.sleep(0.3)
    node = wait_for(
        "the node cordoned", lambda: (n := node_of(api, agent.hostname))["state"] == "cordoned" and n
    )
    assert "flapped 3 times" in node["state_reason"]
    fault = next(f for f in api.get("/api/v1/faults/?source=nic_link_flap")["results"])
    assert fault["hostname"] == agent.hostname and fault["action"] == "cordon_node"
    status, _ = api.call("POST", f"/api/v1/nodes/{node['id']}/uncordon/", {"reason": "cable reseated"})
    assert status == 200


def test_a_port_going_down_moves_the_job(cluster):
    _, api, agents = cluster
    job = submit(api, sleep=600)
    detail = wait_for("every rank running", launched(api, job), timeout=60)
    victim = sorted(current_nodes(detail))[0]
    agent = agents[victim]
    agent.nics.set_state(agent.ports[0], "down")
    fault = wait_for(
        "the port-down fault handled",
        lambda: next(
            (f for f in api.get("/api/v1/faults/?source=nic_port_down")["results"] if f["action"]), None
        ),
        timeout=30,
    )
    assert fault["hostname"] == victim and fault["action"] == "repair_node"
    detail = wait_for(
        "the job running again elsewhere", relaunched(api, job, detail["launched_generation"]), timeout=90
    )
    assert victim not in current_nodes(detail)
    api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {})
    agent.nics.set_state(agent.ports[0], "active")  # the cable replaced; the node comes back
    node = node_of(api, victim)
    for step in ("repair", "return"):
        status, body = api.call("POST", f"/api/v1/nodes/{node['id']}/{step}/", {"reason": "NIC replaced"})
        assert status == 200, body
    wait_for(
        "the job's old processes to end",
        lambda: not agent.pids(job["id"]) or all(not alive(pid) for pid in agent.pids(job["id"]).values()),
        timeout=30,
    )


def test_an_xid_from_nvml_takes_the_node_out_and_the_job_moves_with_measured_recovery(cluster):
    _, api, agents = cluster
    job = submit(api, sleep=600)
    detail = wait_for("every rank running", launched(api, job), timeout=60)
    victim = sorted(current_nodes(detail))[1]
    agents[victim].inject_xid(gpu=1, xid=79)
    fault = wait_for(  # recorded at the report, then handled by the fault task on its own queue
        "the XID fault handled",
        lambda: next(
            (
                f
                for f in api.get("/api/v1/faults/")["results"]
                if f["source"] == "xid" and f["action"] and f["hostname"] == victim
            ),
            None,
        ),
        timeout=30,
    )
    assert fault["xid"] == 79 and fault["action"] == "reboot_node"
    node = next(n for n in api.get("/api/v1/nodes/")["results"] if n["hostname"] == victim)
    assert node["state"] == "down"
    detail = wait_for(
        "the job running again elsewhere", relaunched(api, job, detail["launched_generation"]), timeout=90
    )
    assert victim not in current_nodes(detail) and len(current_nodes(detail)) == 2
    wait_for(  # and its process on the node taken out ends
        "the old process on the faulty node to end",
        lambda: all(
            p["state"] != "running"
            for p in api.get(f"/api/v1/jobs/{job['id']}/")["processes"]
            if p["node"] == victim
        ),
        timeout=30,
    )
    fault = wait_for(
        "the measured recovery",
        lambda: (f := api.get(f"/api/v1/faults/{fault['id']}/"))["recovery_s"] and f,
        timeout=30,
    )
    recovered = next(e for e in detail["events"] if e["kind"] == "recovered")
    assert recovered["data"]["measured"] is True
    assert 0 < fault["recovery_s"] < 90
    api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {})


def test_a_site_whose_agents_all_fall_silent_is_one_partition_and_its_work_runs_on(cluster):
    """Every agent of the datacenter stops at once (the control plane loses the site): one
    partition, no node faults, the job left running, nothing new placed there; when the agents
    come back the partition closes and the job still runs once."""
    stack, api, agents = cluster
    job = submit(api, sleep=600, gpus=GPUS_PER_NODE, topology="node")
    detail = wait_for("the job running", launched(api, job), timeout=60)
    host = next(p["node"] for p in detail["processes"] if p["state"] == "running")
    pid = wait_for("its pid", lambda: next(iter(agents[host].pids(job["id"]).values()), None))
    faults_before = len(api.get("/api/v1/faults/?page_size=200")["results"])
    live = [a for a in agents.values() if a.process.poll() is None]
    for agent in live:
        os.kill(agent.process.pid, signal.SIGSTOP)
    try:
        partition = wait_for(
            "a partition of dc1",
            lambda: next(
                (p for p in api.get("/api/v1/partitions/")["results"] if p["ended_at"] is None), None
            ),
            timeout=45,
        )
        assert partition["datacenter_name"] == "dc1" and partition["source"] == "agents_silent"
        assert partition["nodes"] == len(agents)
        waiting = submit(api, sleep=1, gpus=GPUS_PER_NODE, topology="node")
        time.sleep(3)  # a few cycles: nothing new goes to the site it cannot reach
        assert api.get(f"/api/v1/jobs/{waiting['id']}/")["state"] == "pending"
        assert alive(pid)
    finally:
        for agent in live:
            os.kill(agent.process.pid, signal.SIGCONT)
    wait_for(
        "the partition to close",
        lambda: all(p["ended_at"] for p in api.get("/api/v1/partitions/")["results"]),
        timeout=30,
    )
    detail = api.get(f"/api/v1/jobs/{job['id']}/")
    assert detail["state"] == "running" and alive(pid)
    assert [e["kind"] for e in detail["events"]].count("launched") == 1  # never restarted
    faults = api.get("/api/v1/faults/?page_size=200")["results"]
    assert len(faults) == faults_before  # no heartbeat loss, no requeue storm
    wait_for("the waiting job to start", job_state(api, waiting, "running", "completed"), timeout=30)
    api.call("POST", f"/api/v1/jobs/{job['id']}/cancel/", {})


def test_the_work_runs_on_through_a_20_s_outage_and_no_report_is_lost_or_doubled(cluster):
    stack, api, agents = cluster
    job = submit(api, sleep=600, gpus=GPUS_PER_NODE, topology="node")
    detail = wait_for("the job running", launched(api, job), timeout=60)
    host = next(p["node"] for p in detail["processes"] if p["state"] == "running")
    pid = wait_for("its pid", lambda: next(iter(agents[host].pids(job["id"]).values()), None))
    stack.stop()
    time.sleep(20)
    assert alive(pid)  # the work runs on while the control plane is away
    stack.start()
    wait_for(
        "the agents to catch up",
        lambda: all(
            c["last_seq"] >= agents[c["node"]].seq() - 1
            for c in api.get("/api/v1/node-credentials/")["results"]
            if c["node"] in agents and agents[c["node"]].process.poll() is None
        ),
        timeout=60,
    )
    detail = api.get(f"/api/v1/jobs/{job['id']}/")
    assert detail["state"] == "running" and alive(pid)
    assert [e["kind"] for e in detail["events"]].count("launched") == 1  # never restarted
    assert not [f for f in api.get("/api/v1/faults/")["results"] if f["source"] == "heartbeat_loss"]
    # stop one agent (it sends its last report): every report it made was accepted exactly once
    agent = agents[host]
    agent.stop()
    assert agent.process.returncode == 0
    wait_for("the job's processes to end", lambda: not alive(pid), timeout=15)
    credential = next(c for c in api.get("/api/v1/node-credentials/")["results"] if c["node"] == host)
    assert credential["last_seq"] == agent.seq() == credential["reports_accepted"]
    log = (agent.folder / "agent.log").read_text()
    assert "buffered, retrying" in log  # it did buffer through the outage


def test_a_revoked_node_is_refused_and_its_agent_stops(cluster):
    _, api, agents = cluster
    running = [a for a in agents.values() if a.process.poll() is None]
    agent = running[0]
    credential = next(
        c for c in api.get("/api/v1/node-credentials/")["results"] if c["node"] == agent.hostname
    )
    status, _ = api.call("POST", f"/api/v1/node-credentials/{credential['id']}/revoke/", {"reason": "test"})
    assert status == 200
    wait_for("the agent to exit", lambda: agent.process.poll() is not None, timeout=30)
    assert agent.process.returncode == 3
    assert "refuses this node's credential" in (agent.folder / "agent.log").read_text()
