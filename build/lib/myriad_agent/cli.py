"""``myriad-agent``: start the node agent (see ``myriad-agent --help``)."""

from __future__ import annotations

import logging
import signal
import sys

from myriad_agent.agent import Agent
from myriad_agent.client import Refused, Unreachable
from myriad_agent.config import ConfigError, load
from myriad_agent.gpus import load_nvml


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s myriad-agent %(levelname)s %(message)s")
    try:
        config, args = load(argv)
    except ConfigError as exc:
        print(f"myriad-agent: {exc}", file=sys.stderr)
        return 2
    try:
        nvml = load_nvml(config.nvml)
        agent = Agent(config, nvml)
        agent.enrol_or_load()
        agent.check()
    except ConfigError as exc:
        print(f"myriad-agent: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"myriad-agent: --nvml: {exc}", file=sys.stderr)
        return 2
    except Unreachable as exc:
        print(
            f"myriad-agent: --server: cannot reach the control plane at {config.server}: {exc}",
            file=sys.stderr,
        )
        return 2
    except Refused as exc:
        print(f"myriad-agent: the control plane refused this node: {exc.body}", file=sys.stderr)
        return 2
    if args.check:
        print(f"ok: {config.server} knows this node as {config.hostname}; {agent.reader.count} GPUs")
        return 0

    def stop(signum, frame):
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return agent.run()
