"""The node agent's parts without a server: its settings, NVML readings and XID events (fake
NVML), the report buffer and backoff, and process supervision."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from myriad_agent import fake_nvml
from myriad_agent.client import Backoff, ReportBuffer
from myriad_agent.config import ConfigError, load
from myriad_agent.gpus import GPUReader, load_nvml
from myriad_agent.supervisor import Supervisor


def test_the_agent_package_needs_no_django():
    code = (
        "import sys, myriad_agent.cli, myriad_agent.agent; "
        "print(sorted(m for m in sys.modules if m.startswith(('django', 'rest_framework', 'numpy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--server: the control plane's URL is required"),
        (["--server", "ftp://x"], "--server: 'ftp://x' is not an http(s) URL"),
        (["--server", "http://x", "--period", "soon"], "--period: 'soon' is not a number"),
        (["--server", "http://x", "--period", "0"], "--period: 0 is outside"),
        (
            ["--server", "http://x", "--checkpoint-signal", "SIGNOPE"],
            "--checkpoint-signal: 'SIGNOPE' is not a signal",
        ),
        (["--server", "http://x", "--nvml", "maybe"], "--nvml: 'maybe' is not auto, real or fake"),
        (["--server", "http://x", "--buffer", "1.5"], "--buffer: '1.5' is not a whole number"),
    ],
)
def test_bad_settings_stop_the_agent_with_the_flag_named(argv, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(argv, environ={})


def test_settings_come_from_flags_then_environment_then_defaults(tmp_path):
    config, _ = load(
        ["--period", "2"],
        environ={
            "MYRIAD_AGENT_SERVER": "http://cp:8000/",
            "MYRIAD_AGENT_PERIOD_S": "5",
            "MYRIAD_AGENT_WORK_DIR": str(tmp_path),
        },
    )
    assert config.server == "http://cp:8000" and config.period_s == 2.0 and config.work_dir == tmp_path
    assert (
        config.checkpoint_signal == signal.SIGUSR1 and config.grace_s == 30 and config.buffer_reports == 720
    )
    assert config.checkpoint_root == tmp_path / "checkpoints"


def test_the_cli_fails_at_start_on_an_unreachable_server(tmp_path):
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"gpus": 1}))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "myriad_agent",
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--work-dir",
            str(tmp_path / "w"),
            "--nvml",
            f"fake:{state}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        out.returncode == 2 and "--server: cannot reach the control plane at http://127.0.0.1:9" in out.stderr
    )


@pytest.fixture
def nvml(tmp_path):
    state = tmp_path / "nvml.json"
    state.write_text(
        json.dumps(
            {
                "gpus": 4,
                "util": 50,
                "uuid": "GPU-n1",
                "power_limit_w": 700,
                "gpu": {
                    "2": {
                        "ecc_uncorrected_volatile": 3,
                        "remap_failure": True,
                        "nvlink_crc_errors": 7,
                        "pcie_replays": 2,
                        "retired_pages": 1,
                    }
                },
            }
        )
    )
    return load_nvml(f"fake:{state}"), state


def test_readings_come_from_nvml_calls(nvml):
    module, state = nvml
    reader = GPUReader(module)
    gpus = reader.read()
    assert [g["uuid"] for g in gpus] == [f"GPU-n1-{i}" for i in range(4)]
    g0, g2 = gpus[0], gpus[2]
    assert g0["util"] == 50 and g0["power_limit_w"] == 700 and 90 < g0["power_w"] < 700
    assert g0["memory_total_mib"] == pytest.approx(81559) and g0["sm_clock_mhz"] == 1980
    assert g2["ecc_uncorrected_volatile"] == 3 and g2["remap_failure"] is True and g2["retired_pages"] == 1
    assert g2["nvlink_crc_errors"] == 7 and g2["pcie_replays"] == 2 and g0["nvlink_crc_errors"] == 0
    data = json.loads(state.read_text())
    data["gpu"]["1"] = {"lost": True}
    state.write_text(json.dumps(data))
    assert reader.read_one(1) == {"index": 1, "uuid": "GPU-n1-1", "lost": True}


def test_xids_arrive_through_the_event_set_repeats_included(nvml):
    module, state = nvml
    reader = GPUReader(module)
    reader.start_xid_watch()
    try:
        with open(f"{state}.xids", "a") as f:
            for gpu, xid in ((1, 79), (1, 79), (3, 48)):
                f.write(json.dumps({"gpu": gpu, "xid": xid}) + "\n")
        deadline = time.monotonic() + 10
        seen = []
        while len(seen) < 3 and time.monotonic() < deadline:
            seen += reader.take_xids()
            time.sleep(0.05)
    finally:
        reader.stop()
    assert [(x["gpu"], x["xid"]) for x in seen] == [(1, 79), (1, 79), (3, 48)]


def test_the_fake_event_set_times_out_as_nvml_does(nvml):
    module, _ = nvml
    events = module.nvmlEventSetCreate()
    with pytest.raises(module.NVMLError) as exc:
        module.nvmlEventSetWait(events, 50)
    assert exc.value.value == fake_nvml.NVML_ERROR_TIMEOUT


def test_the_buffer_drops_the_oldest_reports_and_counts_them():
    buffer = ReportBuffer(limit=3)
    for seq in range(1, 6):
        buffer.add({"seq": seq})
    assert buffer.dropped == 2 and [r["seq"] for r in buffer.items] == [3, 4, 5]
    buffer.pop()
    assert buffer.peek() == {"seq": 4}


def test_backoff_doubles_to_its_cap_with_jitter():
    backoff = Backoff(0.5, 8.0, rng=random.Random(1))
    waits = [backoff.next() for _ in range(8)]
    for i, wait in enumerate(waits):
        nominal = min(8.0, 0.5 * 2**i)
        assert 0.5 * nominal <= wait < 1.5 * nominal
    backoff.reset()
    assert backoff.next() < 0.75


def _assignment(job: int, command: str, **env) -> dict:
    return {
        "job": job,
        "generation": "g1",
        "command": command,
        "env": {k: str(v) for k, v in env.items()},
        "gpus": [0],
        "rank": 0,
        "nnodes": 1,
    }


def test_a_process_gets_its_environment_and_a_bounded_tail(tmp_path):
    supervisor = Supervisor(tmp_path, tmp_path / "ckpt", tail_lines=5)
    proc = supervisor.start(
        _assignment(
            1,
            'for i in 1 2 3 4 5 6 7 8; do echo "line $i"; done; echo "$CUDA_VISIBLE_DEVICES"; exit 4',
            CUDA_VISIBLE_DEVICES="0,1",
        )
    )
    deadline = time.monotonic() + 10
    while proc.state == "running" and time.monotonic() < deadline:
        supervisor.poll()
        time.sleep(0.05)
    time.sleep(0.2)  # the reader thread drains the pipe
    report = proc.as_report()
    assert report["state"] == "exited" and report["exit_code"] == 4
    assert report["log_tail"].splitlines() == ["line 5", "line 6", "line 7", "line 8", "0,1"]
    assert "line 1\n" in proc.log.read_text()  # the whole output stays in the job's log file
    assert (tmp_path / "ckpt" / "1").is_dir()


def test_stop_sends_sigterm_then_sigkill_after_the_grace_period(tmp_path):
    supervisor = Supervisor(tmp_path, tmp_path / "ckpt")
    stubborn = supervisor.start(_assignment(2, "trap '' TERM; sleep 60 & wait; sleep 60"))
    polite = supervisor.start({**_assignment(3, "sleep 60"), "generation": "g2"})
    time.sleep(0.3)
    started = time.monotonic()
    supervisor.stop(stubborn, grace_s=1.0)
    supervisor.stop(polite, grace_s=1.0)
    while supervisor.running() and time.monotonic() - started < 10:
        supervisor.poll()
        time.sleep(0.05)
    assert polite.exit_code == -signal.SIGTERM
    assert stubborn.exit_code == -signal.SIGKILL and time.monotonic() - started >= 1.0


def test_a_process_is_reported_when_its_state_changes_not_in_every_report(tmp_path):
    supervisor = Supervisor(tmp_path, tmp_path / "ckpt")
    proc = supervisor.start(_assignment(4, "sleep 0.3"))
    now = time.time()
    first = [p.as_report() for p in supervisor.to_report(now)]
    assert [(p["job"], p["state"]) for p in first] == [(4, "running")]
    supervisor.accepted(first, now)
    assert supervisor.to_report(now + 1) == []  # running, already heard of: readings only
    assert supervisor.to_report(now + 61) == [proc]  # its output tail is refreshed now and then
    deadline = time.monotonic() + 10
    while proc.state == "running" and time.monotonic() < deadline:
        supervisor.poll()
        time.sleep(0.05)
    ended = [p.as_report() for p in supervisor.to_report(now + 2)]
    assert [(p["state"], p["exit_code"]) for p in ended] == [
        ("exited", 0)
    ]  # until a report carrying it is accepted
    supervisor.forget(keep={proc.key})
    assert proc.key in supervisor.processes  # still assigned: not started again
    supervisor.accepted(ended, now + 2)
    supervisor.forget(keep=set())
    assert supervisor.to_report(now + 3) == [] and proc.key not in supervisor.processes


def test_the_agent_reads_progress_lines_and_waits_for_half_written_ones(tmp_path):
    from myriad_agent.supervisor import PROGRESS_WINDOW, Process, _read_progress

    path = tmp_path / "progress.jsonl"
    proc = Process(1, "g", None, tmp_path / "log", tmp_path / "ck", 0.0, progress_file=path)
    _read_progress(proc)  # no file yet: nothing
    assert proc.step is None
    lines = [json.dumps({"step": s, "compute_s": 0.5}) for s in range(12)]
    path.write_text("\n".join(lines[:10]) + "\nnot json\n" + lines[10] + "\n" + lines[11][:5])
    _read_progress(proc)
    assert proc.step == 10 and len(proc.compute_s) == PROGRESS_WINDOW
    with path.open("a") as f:
        f.write(lines[11][5:] + "\n" + json.dumps({"step": 3}) + "\n")  # an older step changes nothing
    _read_progress(proc)
    assert proc.step == 11
