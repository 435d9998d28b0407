"""`explain LOG`: a crashed run's log read for the failure classes the probes know."""
