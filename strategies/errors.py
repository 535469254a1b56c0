"""The error every configuration problem raises. Torch-free, and imported by the registry and the
configuration alike (so that neither imports the other for it)."""


class ConfigError(ValueError):
    """A configuration or configuration file that cannot be used; the message is one line for the
    user, naming the problem and the allowed values."""
