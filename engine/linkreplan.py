"""What a job crossing a link does once the link changed under it: stay, move wholly into one
datacenter, or shrink into one (pure). The move's save, restart and restore are weighed against
the time the slower steps lose (engine.sites gives the step times across and inside)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.physics import Physics
from engine.reasons import duration

DEFAULT_REPLAN_SLOWDOWN = 0.2  # a crossing job slower than this over one datacenter is re-planned


def move_seconds(
    gpus: int, state_bytes: float, unsaved_s: float, saves: bool, ph: Physics | None = None
) -> float:
    """Training time a move costs a running job: a save (or, when its policy cannot save on
    demand, the work since its last checkpoint), rescheduling, process start and communicators on
    the new GPUs, and the checkpoint loaded back from durable storage."""
    ph = ph or Physics()
    bandwidth = ph.storage_gbps(gpus) * 1e9
    save = state_bytes / bandwidth if saves else unsaved_s
    return save + ph.reschedule_s + ph.process_start_s + ph.comm_init_s(gpus) + state_bytes / bandwidth


@dataclass(frozen=True)
class Replan:
    action: str  # "stay", "move" (wholly into one datacenter), "shrink" (to its GPUs in one)
    note: str  # why, with the numbers
    finish_s: float  # time to do the remaining work this way


def replan(
    slowdown: float,
    remaining_s: float,
    *,
    threshold: float = DEFAULT_REPLAN_SLOWDOWN,
    move_s: float | None = None,
    move_to: str = "",
    shrink_speed: float | None = None,
    shrink_gpus: int = 0,
) -> Replan:
    """What a job crossing a link does once its step time changed. ``slowdown``: its step time
    across the link over inside one datacenter, less 1; ``remaining_s``: its work left, in
    seconds at full speed. Within the threshold it stays. Past it, whichever finishes sooner:
    stay (remaining x (1 + slowdown)), move wholly into ``move_to``, a datacenter that holds it
    now (``move_s`` + remaining), or, elastic, shrink to its ``shrink_gpus`` GPUs inside one
    datacenter (remaining / ``shrink_speed``: its throughput there over at full size)."""
    slower = f"{slowdown * 100:.1f}% slower across the link than in one datacenter"
    stay = remaining_s * (1 + slowdown)
    lost = f"+{duration(stay - remaining_s)} over {duration(remaining_s)}"
    if slowdown <= threshold:
        return Replan("stay", f"{slower}, within the {threshold:.0%} threshold: stays", stay)
    options = [("stay", stay, "", "")]
    if move_s is not None:
        options.append(("move", remaining_s + move_s, f"moves into {move_to}", f"moving into {move_to}"))
    if shrink_speed:
        kept = f"to its {shrink_gpus} GPUs in one datacenter"
        options.append(("shrink", remaining_s / shrink_speed, f"shrinks {kept}", f"shrinking {kept}"))
    action, finish, chosen, _ = min(options, key=lambda o: o[1])
    if action != "stay":
        costs = f" (the move costs {duration(move_s)})" if action == "move" else ""
        return Replan(action, f"{slower} ({lost}): {chosen}{costs}, done in {duration(finish)}", finish)
    if len(options) == 1:
        why = "no datacenter holds it now and it cannot shrink into one"
    else:
        why = "; ".join(f"{o[3]} would take {duration(o[1])}" for o in options[1:])
        why += f" against {duration(stay)}"
    return Replan("stay", f"{slower} ({lost}): stays, {why}", stay)
