"""Run plumbing shared by both worlds: checkpoints, metrics, preemption, numerical guards."""
