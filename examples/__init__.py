"""Example workloads: `gputune bench --workload examples.<module>:<function>`."""
