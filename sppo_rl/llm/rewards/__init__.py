"""Rewards: bounded math verifiers (:mod:`.verify`) and the scorer that runs reward functions in worker
processes with time and memory limits (:mod:`.scorer`). Model outputs are untrusted: nothing here
evaluates them."""
