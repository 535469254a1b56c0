"""The one error a workload raises: apart, so that the kinds of workload built by name
(`workload_kinds`) and the workloads package can both raise it without importing each other."""

from strategies.errors import ConfigError


class WorkloadError(ConfigError):
    """A workload that cannot be built or used; the message is one line for the user. A
    ConfigError, so that raised during a trial (`build_model` returning no model) it makes an
    "invalid" row, not a crash."""
