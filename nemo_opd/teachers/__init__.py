"""Teachers that live outside the run's Ray workers (the in-process ones are nemo_opd.policy)."""
