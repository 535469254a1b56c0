"""gputune: tune a PyTorch training run from the terminal."""

__version__ = "0.1.0"
