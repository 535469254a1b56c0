"""The one thing pyproject.toml cannot say: the `kernels/` folder installs as `gputune_kernels`,
because `kernels` is the import name of Hugging Face's package on PyPI and one would shadow the
other. `gputune` is the small public module scripts import; `strategies` and `tuner_tui` hold
the rest. Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["gputune", "tuner_tui*", "strategies*"]) + ["gputune_kernels"],
    package_dir={"gputune_kernels": "kernels"},
)
