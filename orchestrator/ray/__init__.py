"""Everything that talks to Ray from the control plane: finding and joining a cluster
(`cluster`), starting one job's training run on it (`launcher`), and the small actor that
carries a run's metrics, events and stop requests (`run_state`)."""
