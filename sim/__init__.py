"""The simulated world around the core: the simulated fleet (telemetry and faults), the workload
generator and trace loaders, and the discrete-event runner of what-if simulations. It calls the
same core functions (engine) as production; the core never imports this package."""
