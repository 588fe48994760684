"""Signals other apps listen to, so the inventory never imports them (cluster <- scheduling <-
monitoring, no edge back)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent after nodes changed state, inside the transaction that changed them.
# Arguments: nodes (list of Node, with their new state), action (a key of
# engine.states.NODE_TRANSITIONS), at (the time of the change).
nodes_changed = Signal()
