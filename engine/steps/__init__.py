"""The steps of one scheduling cycle, one module each, combined by engine.scheduler.Cycle."""
