"""The agent's network sampling on a fake sysfs tree: which ports it finds, what a report's port
summary says about 10 ms windows (bursts a 10 s mean hides, congestion, flaps to 10 ms), counters
that wrap or reset, the recorded trace, and the sampler thread keeping its period."""

from __future__ import annotations

import json
import os
import time

import pytest

from myriad_agent import fake_nvml, fake_sysfs
from myriad_agent.config import ConfigError, load
from myriad_agent.gpus import GPUReader
from myriad_agent.network import NetSampler, counter_deltas, percentile
from myriad_agent.nics import discover

LINE = 400e9 / 8  # bytes per second of a 400 Gb/s port


@pytest.fixture
def tree(tmp_path):
    names = fake_sysfs.build(tmp_path, ib_ports=8, eth=1)
    fake = fake_sysfs.FakePorts(tmp_path)
    yield tmp_path, names, fake
    fake.close()


def _sampler(root, interval_s=0.01):
    sampler = NetSampler(discover(root), interval_s)
    sampler.open()
    return sampler


def _run(sampler, fake, ports, seconds, util_at, t0=1_000_000.0, each=None):
    """Sample ``seconds`` of 10 ms windows with ``util_at(k)`` of line rate in window k on
    ``ports``: one sample more than the windows, so the run ends on a sample that reads every
    counter (a report covers up to there)."""
    steps = int(round(seconds / sampler.interval_s)) + 1
    for k in range(steps):
        t = t0 + k * sampler.interval_s
        if k:
            moved = int(LINE * util_at(k) * sampler.interval_s)
            for port in ports:
                fake.add_bytes(port, moved, moved // 2)
        if each:
            each(k, t)
        sampler.sample(at=t)
    return t0 + (steps - 1) * sampler.interval_s


def _by_port(summary):
    return {p["port"]: p for p in summary}


def test_it_finds_rdma_ports_and_real_nics_and_leaves_out_what_a_nic_lacks(tmp_path):
    fake_sysfs.build(tmp_path / "roce", ib_ports=2, eth=1)
    fake_sysfs.build(tmp_path / "ib", ib_ports=1, roce=False)
    roce = discover(tmp_path / "roce")
    # the RoCE ports' own netdevs (ens0np0, ...) and lo (no device) are not reported again
    assert [(p.name, p.kind, p.rail) for p in roce] == [
        ("mlx5_0/1", "ib", 0),
        ("mlx5_1/1", "ib", 1),
        ("eth0", "eth", 2),
    ]
    ib = discover(tmp_path / "ib")
    names = {name for name, *_ in ib[0].counters}
    assert "np_cnp_sent" not in names and "port_xmit_data" in names  # no hw_counters on plain IB
    sampler = _sampler(tmp_path / "ib")
    for k in range(3):
        sampler.sample(at=100 + k * 0.01)
    (port,) = sampler.summary()
    assert "cnp_sent_per_s" not in port and "np_cnp_sent" not in port["counters"]
    assert port["rate_gbps"] == 400 and port["state"] == "active"
    assert sampler.inventory() == [{"name": "mlx5_0/1", "kind": "ib", "rail": 0, "rate_gbps": 400.0}]


def test_bursts_of_an_all_reduce_show_in_p99_where_a_10_s_mean_hides_them(tree):
    root, names, fake = tree
    sampler = _sampler(root)
    # each second: 100 ms of all-reduce at 95% of line rate, the rest at 2%
    _run(sampler, fake, names[:8], 10.0, lambda k: 0.95 if k % 100 < 10 else 0.02)
    port = _by_port(sampler.summary())["mlx5_3/1"]
    util = port["util"]
    assert util["mean"] < 15  # what a 10 s exporter would plot: a quiet link
    assert util["p50"] < 5 and util["p99"] > 90 and util["max"] > 90
    assert port["bursts"] == 100 and port["windows"] == 1000
    words = 100 * (int(LINE * 0.95 * 0.01) // 4) + 900 * (int(LINE * 0.02 * 0.01) // 4)
    assert port["tx_bytes"] == words * 4  # port_xmit_data counts 4-byte words
    assert port["rx_bytes"] == pytest.approx(port["tx_bytes"] / 2, rel=0.01)
    assert _by_port(sampler.summary())["eth0"]["tx_bytes"] == 0  # an idle NIC reads zero


def test_two_reports_in_a_row_lose_no_bytes_between_them(tree):
    root, names, fake = tree
    sampler = _sampler(root)
    end = _run(sampler, fake, names[:1], 2.0, lambda k: 0.5)
    first = _by_port(sampler.summary())["mlx5_0/1"]["tx_bytes"]
    _run(sampler, fake, names[:1], 1.99, lambda k: 0.5, t0=end + 0.01)  # ends on a full sample
    second = _by_port(sampler.summary())["mlx5_0/1"]["tx_bytes"]
    assert first + second == fake.get("mlx5_0/1", "port_xmit_data") * 4


def test_congestion_counters_become_rates_and_waiting_a_share_of_windows(tree):
    root, names, fake = tree
    sampler = _sampler(root)

    def congest(k, t):
        if k and k % 4 == 0:  # one window in four waits to transmit
            fake.add("mlx5_1/1", "port_xmit_wait", 1000)
        if k:
            fake.add("mlx5_1/1", "np_cnp_sent", 5)
            fake.add("mlx5_1/1", "np_ecn_marked_roce_packets", 50)

    _run(sampler, fake, names[:2], 2.0, lambda k: 0.6, each=congest)
    port = _by_port(sampler.summary())["mlx5_1/1"]
    assert port["cnp_sent_per_s"] == pytest.approx(500, rel=0.01)
    assert port["ecn_marked_per_s"] == pytest.approx(5000, rel=0.01)
    assert port["xmit_wait_share"] == pytest.approx(0.25, abs=0.01)
    quiet = _by_port(sampler.summary())["mlx5_0/1"]  # nothing since the last summary on mlx5_0
    assert quiet["tx_bytes"] == 0


def test_a_flap_is_timed_to_its_10_ms_window_and_errors_are_counted(tree):
    root, names, fake = tree
    sampler = _sampler(root)

    def trouble(k, t):
        if k == 137:
            fake.flap("mlx5_2/1")
        if k == 150:
            fake.add("mlx5_2/1", "symbol_error", 7)

    _run(sampler, fake, names[:8], 2.0, lambda k: 0.1, each=trouble)
    ports = _by_port(sampler.summary())
    assert ports["mlx5_2/1"]["flaps"] == [round(1_000_000.0 + 1.37, 2)]
    # error counters are read every tenth sample: the 7 symbol errors are all there
    assert ports["mlx5_2/1"]["errors"] == {"symbol_error": 7}
    assert ports["mlx5_0/1"]["flaps"] == [] and "errors" not in ports["mlx5_0/1"]


def test_a_port_going_down_shows_in_its_state(tree):
    root, names, fake = tree
    sampler = _sampler(root)
    sampler.sample(at=1.0)
    fake.set_state("mlx5_4/1", "down")
    for k in range(1, 12):  # the state is read with the slow counters, every tenth sample
        sampler.sample(at=1.0 + k * 0.01)
    ports = _by_port(sampler.summary())
    assert ports["mlx5_4/1"]["state"] == "down" and ports["mlx5_3/1"]["state"] == "active"


def test_counters_that_wrap_are_followed_and_a_reset_is_flagged():
    top32, top64 = 1 << 32, 1 << 64
    assert counter_deltas([top32 - 10, 5, 20]) == ([15, 15], False)  # a 32-bit counter wrapped
    assert counter_deltas([top64 - 4, 6]) == ([10], False)  # a 64-bit counter wrapped
    assert counter_deltas([1000, 1500, 40, 90]) == ([500, 40, 50], True)  # reset to zero, counted on
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([], 99) == 0.0


def test_a_reset_port_says_so_and_counts_from_zero(tree):
    root, names, fake = tree
    sampler = _sampler(root)
    _run(sampler, fake, names[:1], 0.5, lambda k: 0.5)
    sampler.summary()
    fake.set("mlx5_0/1", "port_xmit_data", 1000)  # perfquery -R, then 4,000 bytes sent
    for k in range(10):  # up to the next sample that reads every counter
        sampler.sample(at=2_000_000.0 + k * 0.01)
    port = _by_port(sampler.summary())["mlx5_0/1"]
    assert port["reset"] is True and port["tx_bytes"] == 4000
    assert _by_port(sampler.summary())["mlx5_1/1"]["reset"] is False


def test_the_trace_holds_the_last_seconds_of_windows(tree):
    root, names, fake = tree
    sampler = NetSampler(discover(root), 0.01, keep_s=2.0)  # a short ring: it wraps below
    sampler.open()
    _run(sampler, fake, names[:1], 5.0, lambda k: 0.95 if k % 100 < 10 else 0.02)
    trace = sampler.trace(1.0)
    assert trace["interval_ms"] == 10 and len(trace["t_ms"]) == 100
    series = {p["port"]: p for p in trace["ports"]}["mlx5_0/1"]
    assert len(series["tx_util"]) == 100 and len(series["np_cnp_sent"]) == 100
    assert max(series["tx_util"]) > 90 and min(series["tx_util"]) < 5
    assert series["states"] == [[0, "active"]]
    whole = sampler.trace(60.0)  # more than the ring keeps: what it has
    assert len(whole["t_ms"]) == sampler.capacity - 1


def test_the_sampler_thread_keeps_its_period(tree):
    root, names, _ = tree
    sampler = NetSampler(discover(root), 0.01)
    sampler.start()
    time.sleep(1.0)
    sampler.stop()
    assert 80 <= sampler.count + sampler.missed <= 110
    # a report covers up to the newest sample that read every counter (one in ten)
    assert sampler.summary()[0]["windows"] == (sampler.count - 1) // 10 * 10


def test_the_sampler_says_how_its_thread_is_scheduled_as_the_kernel_has_it(tree):
    """Real-time (SCHED_FIFO) where asked and allowed, keeping the 10 ms grid on a busy node;
    normal priority otherwise; what the sampler reports is what the kernel runs it at."""
    root, _, _ = tree
    for realtime in (True, False):
        sampler = NetSampler(discover(root), 0.01, realtime=realtime)
        sampler.start()
        while sampler.count < 3:
            time.sleep(0.01)
        policy = os.sched_getscheduler(sampler._thread.native_id)
        sampler.stop()
        if sampler.scheduling.startswith("real-time"):
            assert realtime and policy == os.SCHED_FIFO
        else:
            assert sampler.scheduling.startswith("normal") and policy == os.SCHED_OTHER
        if not realtime:
            assert sampler.scheduling == f"normal (nice {sampler.priority})"


def test_a_bad_sampling_interval_is_named(tmp_path):
    base = ["--server", "http://127.0.0.1:9", "--work-dir", str(tmp_path)]
    config, _ = load(base, environ={})
    assert config.net_interval_s == 0.01 and str(config.sysfs_root) == "/"
    assert load([*base, "--net-interval-ms", "0"], environ={})[0].net_interval_s == 0
    for bad in ("0.5", "-1", "fast"):
        with pytest.raises(ConfigError, match="--net-interval-ms"):
            load([*base, "--net-interval-ms", bad], environ={})
    assert config.net_realtime and not load([*base, "--net-realtime", "no"], environ={})[0].net_realtime
    with pytest.raises(ConfigError, match="--net-realtime: 'sometimes' is not yes or no"):
        load([*base], environ={"MYRIAD_AGENT_NET_REALTIME": "sometimes"})


def test_nvlink_throughput_comes_from_nvml_field_values_and_is_left_out_where_missing(tmp_path):
    state = tmp_path / "nvml.json"
    gpu0 = {"nvlink_tx_kib": 18_000, "nvlink_rx_kib": 36_000}
    state.write_text(json.dumps({"gpus": 2, "nvlinks": 18, "gpu": {"0": gpu0}}))
    fake_nvml.use_state_file(str(state))
    reader = GPUReader(fake_nvml)
    first = reader.read()
    assert first[0]["nvlink_tx_bytes"] == 18_000 * 1024 and first[0]["nvlink_rx_bytes"] == 36_000 * 1024
    assert "nvlink_tx_gbps" not in first[0]  # a rate needs two reads
    assert "nvlink_tx_bytes" not in first[1]  # this GPU's NVML has no such field: not invented
    gpu0["nvlink_tx_kib"] += 18 * 1_000_000  # 18 links x ~1 GB more sent
    state.write_text(json.dumps({"gpus": 2, "nvlinks": 18, "gpu": {"0": gpu0}}))
    time.sleep(0.2)
    second = reader.read()[0]
    assert second["nvlink_tx_gbps"] > 100 and second["nvlink_rx_gbps"] == 0
