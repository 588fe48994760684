"""Faults: recorded, judged (engine.lifecycle.judge) and handled (services); hung and slow ranks
(progress); what a drain or a mark-down would hit (drain_preview)."""
