"""The engine: worker process, training loop, measurement, workloads, headless commands.

Imports torch only in the modules that train (worker, trial, workloads); protocol, client and
telemetry stay torch-free because the dashboard uses them.
"""
