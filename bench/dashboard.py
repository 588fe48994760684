"""Live dashboard at scale: first paint of the every-GPU heatmap in headless Chromium, the size of
the websocket frames, and the server's CPU for fanning 1 Hz frames out to 20 clients; the same for
the fleet view a level at a time (/live/levels/: the cluster's pods, a pod's racks, a rack's nodes,
a node's GPUs), each level opened straight from its URL, and 20 clients on mixed levels.

A whole stack runs (ASGI server, Celery worker and beat) on the chosen preset; this process plays
the fleet at exactly 1 Hz, as the simulated fleet's tick does (Fleet.step on 70% of the nodes busy,
the frame written to the live store and published through the channel layer), so frames arrive
on time however busy the worker is (an idle cluster's frames would compress to almost nothing), on the
embedded default or, with MYRIAD_DATABASE_URL / MYRIAD_REDIS_URL set, on PostgreSQL and the Redis
channel layer. First paint: navigation start to the heatmap's first Plotly render (the page
records it), five fresh page loads. Fan-out: CPU time of the server process (utime + stime of
every thread, from /proc) over a window with no clients, then with N websocket clients that each
receive and decode every frame in this process.

    python -m bench.dashboard [--cluster 100k] [--clients 20] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

from tests.browser_stack import CHROMIUM, CHROMIUM_ARGS, PASSWORDS, start_stack

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _wait_for_frame(stack, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(
        f"{stack.url}/api/v1/telemetry/frame/", headers={"Authorization": f"Token {stack.tokens['viewer']}"}
    )
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError("no telemetry frame within the timeout")


class FleetPlayer(threading.Thread):
    """Frames at 1 Hz for the stack's inventory, written and published as the fleet tick does."""

    def __init__(self, busy: float) -> None:
        super().__init__(daemon=True)
        self.busy = busy
        self.stopped = threading.Event()
        self.frames = 0

    def run(self) -> None:
        import numpy as np

        from cluster.snapshot import topology_cache
        from engine.frames import encode_frame
        from monitoring.telemetry.livestore import FRAME_KEY, live_store, publish_frame
        from sim.fleet import Fleet

        snap = topology_cache.current()
        fleet = Fleet(snap, seed=1)
        busy_nodes = np.random.default_rng(2).random(snap.num_nodes) < self.busy
        util = np.where(busy_nodes[snap.gpu_node], 0.92, 0.0).astype(np.float32)
        store, previous, t = live_store(), None, 0.0
        next_at = time.monotonic()
        while not self.stopped.is_set():
            t += 60.0
            fleet.step(t, util)
            encoded = encode_frame(self.frames + 1, t, fleet.frame())
            store.put(FRAME_KEY, encoded)
            publish_frame(previous, encoded)
            previous, self.frames = encoded, self.frames + 1
            next_at += 1.0
            self.stopped.wait(max(0.0, next_at - time.monotonic()))


def _session_cookie(stack) -> str:
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{stack.url}/accounts/login/").read()
    csrf = next(c.value for c in jar if c.name == "csrftoken")
    body = urllib.parse.urlencode(
        {"username": "viewer", "password": PASSWORDS["viewer"], "csrfmiddlewaretoken": csrf}
    ).encode()
    opener.open(
        urllib.request.Request(f"{stack.url}/accounts/login/", data=body, headers={"Referer": stack.url})
    )
    return "; ".join(f"{c.name}={c.value}" for c in jar)


MARKS_JS = (
    "Object.assign(Object.fromEntries(['myriad-layout', 'myriad-snapshot'].map(m => "
    "[m, (performance.getEntriesByName(m)[0] || {}).startTime])), "
    "{dcl: performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd})"
)


def _logged_in(browser, stack):
    """A fresh browser context (empty cache) logged in as the viewer, and its page."""
    context = browser.new_context(base_url=stack.url, viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    page.goto("/accounts/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", PASSWORDS["viewer"])
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
    return context, page


def first_paint(stack, loads: int) -> dict:
    """Each load in a fresh browser context (empty cache: plotly.js is fetched and parsed every
    time) against a running server that has served the page before, as an operator meets it."""
    from playwright.sync_api import sync_playwright

    cookie = _session_cookie(stack)
    for path in ("/live/", "/api/v1/telemetry/layout/"):  # a server that has served the page before
        urllib.request.urlopen(urllib.request.Request(stack.url + path, headers={"Cookie": cookie})).read()
    times, snapshot_bytes, delta_bytes, marks = [], [], [], []

    def on_ws(ws):
        def on_frame(payload):
            if isinstance(payload, bytes | bytearray) and payload:
                (snapshot_bytes if payload[:1] == b"S" else delta_bytes).append(len(payload))

        ws.on("framereceived", on_frame)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for i in range(loads):
            context, page = _logged_in(browser, stack)
            page.on("websocket", on_ws)
            page.goto("/live/")
            page.wait_for_function("window.myriadFirstPaint !== undefined", timeout=60_000)
            times.append(page.evaluate("window.myriadFirstPaint"))
            marks.append(page.evaluate(MARKS_JS))
            if i == loads - 1:
                page.wait_for_timeout(3000)  # a few deltas
                cells = page.evaluate(
                    "document.getElementById('heat').data[0].z.flat().filter(v => v !== null).length"
                )
            context.close()
        browser.close()
    return {
        "first_paint_ms": times,
        "marks": marks,
        "cells": cells,
        "snapshot_bytes": max(snapshot_bytes) if snapshot_bytes else None,
        "delta_bytes_max": max(delta_bytes) if delta_bytes else None,
    }


async def _clients(url: str, cookie: str, n: int, seconds: float, first: list[str] | None = None) -> dict:
    """``n`` websocket clients that each receive every message for ``seconds``; client i first
    sends ``first[i]`` when given (the view it shows)."""
    import websockets

    counts = [0] * n
    sizes: list[int] = []

    async def one(i: int) -> None:
        async with websockets.connect(
            url,
            additional_headers={"Cookie": cookie},
            origin=url.replace("ws://", "http://").split("/ws/")[0],
            max_size=None,
        ) as ws:
            if first:
                await ws.send(first[i])
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                try:
                    msg = await asyncio.wait_for(ws.recv(), timeout=left)
                except TimeoutError:
                    break
                counts[i] += 1
                sizes.append(len(msg))

    await asyncio.gather(*(one(i) for i in range(n)))
    return {"messages": counts, "bytes": sum(sizes)}


def fan_out(stack, clients: int, seconds: float) -> dict:
    pid = stack.process.pid
    c0, t0 = _cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    idle = (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    cookie = _session_cookie(stack)
    ws_url = stack.url.replace("http://", "ws://") + "/ws/telemetry/"
    c0, t0 = _cpu_seconds(pid), time.monotonic()
    got = asyncio.run(_clients(ws_url, cookie, clients, seconds))
    busy = (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    return {
        "clients": clients,
        "seconds": seconds,
        "server_cpu_idle": round(idle, 4),
        "server_cpu_with_clients": round(busy, 4),
        "messages_per_client_min": min(got["messages"]),
        "messages_per_client_max": max(got["messages"]),
        "megabytes_sent": round(got["bytes"] / 1e6, 1),
    }


def _api_json(stack, path: str) -> dict:
    request = urllib.request.Request(
        stack.url + path, headers={"Authorization": f"Token {stack.tokens['viewer']}"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def level_views(stack) -> dict[str, str]:
    """The URL query of each step down: the cluster (its pods), a datacenter (its pods), a pod (its
    racks), a rack (its nodes), a node (its GPUs): the first cell of each."""
    dc = _api_json(stack, "/api/v1/telemetry/levels/?level=datacenter")["cells"][0]["id"]
    pod = _api_json(stack, f"/api/v1/telemetry/levels/?level=pod&within=datacenter:{dc}")["cells"][0]["id"]
    rack = _api_json(stack, f"/api/v1/telemetry/levels/?level=rack&within=pod:{pod}")["cells"][0]["id"]
    node = _api_json(stack, f"/api/v1/telemetry/levels/?level=node&within=rack:{rack}")["cells"][0]["id"]
    return {
        "cluster": "level=pod",
        "datacenter": f"level=pod&within=datacenter:{dc}",
        "pod": f"level=rack&within=pod:{pod}",
        "rack": f"level=node&within=rack:{rack}",
        "node": f"level=gpu&within=node:{node}",
    }


def level_paint(stack, views: dict[str, str], loads: int) -> dict:
    """First paint of each level opened from its URL in a fresh browser context, and the size of
    the views the server pushes over /ws/levels/ for each."""
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {name: [] for name in views}
    sizes: dict[str, list[int]] = {name: [] for name in views}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(loads):
            context, page = _logged_in(browser, stack)
            for name, query in views.items():
                current: list[int] = sizes[name]

                def on_ws(ws, into=current):
                    if ws.url.endswith("/ws/levels/"):
                        ws.on("framereceived", lambda payload: into.append(len(str(payload).encode())))

                page.on("websocket", on_ws)
                page.goto(f"/live/levels/?{query}")
                page.wait_for_function("window.myriadLevelPaint !== undefined", timeout=60_000)
                times[name].append(page.evaluate("window.myriadLevelPaint"))
                page.wait_for_timeout(2500)  # a pushed frame or two
                page.remove_listener("websocket", on_ws)
            context.close()
        browser.close()
    return {"times": times, "sizes": sizes}


def level_fan_out(stack, views: dict[str, str], clients: int, seconds: float) -> dict:
    """``clients`` websocket clients on the levels in turn (mixed levels), the server's CPU."""
    pid = stack.process.pid
    cookie = _session_cookie(stack)
    ws_url = stack.url.replace("http://", "ws://") + "/ws/levels/"
    queries = list(views.values())
    mixed = [json.dumps(dict(urllib.parse.parse_qsl(queries[i % len(queries)]))) for i in range(clients)]
    c0, t0 = _cpu_seconds(pid), time.monotonic()
    got = asyncio.run(_clients(ws_url, cookie, clients, seconds, mixed))
    return {
        "level_clients": clients,
        "level_server_cpu_with_clients": round((_cpu_seconds(pid) - c0) / (time.monotonic() - t0), 4),
        "level_messages_per_client_min": min(got["messages"]),
        "level_messages_per_client_max": max(got["messages"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="100k")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--busy", type=float, default=0.7, help="share of nodes the played fleet keeps busy")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"needs Debian's Chromium at {CHROMIUM}")
    layer = "redis" if os.environ.get("MYRIAD_REDIS_URL") else "in-memory (per-process broadcaster)"
    database = "postgresql" if os.environ.get("MYRIAD_DATABASE_URL") else "sqlite"
    with tempfile.TemporaryDirectory(prefix="myriad-dashboard-") as tmp:
        t = time.perf_counter()
        stack = start_stack(Path(tmp), args.cluster, simulated_fleet=False)
        os.environ.update(stack.env)  # this process plays the fleet against the same stores
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()
        player = FleetPlayer(args.busy)
        player.start()
        try:
            _wait_for_frame(stack)
            setup_s = time.perf_counter() - t
            paint = first_paint(stack, args.loads)
            fan = fan_out(stack, args.clients, args.seconds)
            views = level_views(stack)
            levels = level_paint(stack, views, max(3, args.loads))
            level_fan = level_fan_out(stack, views, args.clients, args.seconds)
        finally:
            player.stopped.set()
            stack.stop()
    busy = args.busy
    p50 = statistics.median(paint["first_paint_ms"])
    for i, (ms, m) in enumerate(zip(paint["first_paint_ms"], paint["marks"], strict=True)):
        print(
            f"load {i + 1}: page ready {m['dcl']:.0f} ms, layout {m['myriad-layout']:.0f} ms, "
            f"snapshot decoded {m['myriad-snapshot']:.0f} ms, heatmap drawn {ms:.0f} ms"
        )
    print(f"cluster {args.cluster}: {paint['cells']:,} heatmap cells; {database}, channel layer {layer}")
    print(f"stack set-up (migrate, build, start, first frame): {setup_s:.1f} s; {busy:.0%} of nodes busy")
    print()
    print("figure                                   value        target")
    worst = max(paint["first_paint_ms"])
    print(f"heatmap first paint p50 / max (ms)       {p50:,.0f} / {worst:,.0f}    < 2,000")
    print(f"snapshot frame (bytes)                   {paint['snapshot_bytes']:,}      < 150,000")
    print(f"largest delta frame (bytes)              {paint['delta_bytes_max'] or 0:,}")
    print(f"server CPU, no clients (share of a core) {fan['server_cpu_idle']:.1%}")
    with_clients = fan["server_cpu_with_clients"]
    print(f"server CPU, {fan['clients']} clients at 1 Hz          {with_clients:.1%}        < 20%")
    print(
        f"frames per client in {fan['seconds']:.0f} s               "
        f"{fan['messages_per_client_min']}-{fan['messages_per_client_max']}"
    )
    print()
    print("fleet view, opened from its URL           first paint p50 / max (ms)   pushed view (bytes, max)")
    level_figures = {}
    for name, ms in levels["times"].items():
        size = max(levels["sizes"][name], default=0)
        print(
            f"{name + ' (' + views[name] + ')':<42}{statistics.median(ms):>8,.0f} / {max(ms):,.0f}{size:>22,}"
        )
        level_figures[f"first_paint_ms_p50_{name}"] = round(statistics.median(ms))
        level_figures[f"frame_bytes_max_{name}"] = size
    level_figures["top_level_frame_bytes_max"] = level_figures["frame_bytes_max_cluster"]
    level_cpu = level_fan["level_server_cpu_with_clients"]
    print(f"server CPU, {level_fan['level_clients']} clients on mixed levels    {level_cpu:.1%}        < 20%")
    print(
        json.dumps(
            {
                "cluster": args.cluster,
                "database": database,
                "channel_layer": "redis" if layer == "redis" else "in-memory",
                "cells": paint["cells"],
                "busy_share": busy,
                "first_paint_ms_p50": round(p50),
                "first_paint_ms_max": round(max(paint["first_paint_ms"])),
                "snapshot_bytes": paint["snapshot_bytes"],
                "delta_bytes_max": paint["delta_bytes_max"],
                **fan,
                **level_figures,
                **level_fan,
            }
        )
    )


if __name__ == "__main__":
    main()
