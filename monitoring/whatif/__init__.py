"""What-if: stored simulations (simulations) and their reports (simreport), and the simulated
fleet playing the cluster's nodes live (fleet_driver)."""
