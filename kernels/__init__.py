"""Fused Triton kernels for training, forward and backward, registered as torch custom ops
(`_api.py` says more). This folder installs and imports as `gputune_kernels`."""

from __future__ import annotations

import os
import sys

if __name__ == "kernels":
    # From the checkout's root (`python -m pytest` puts it first on sys.path) `import kernels`
    # finds this folder first; that name is Hugging Face's package, which transformers (5.25
    # and later depend on it) imports: hand the name over to it.
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _spec = PathFinder.find_spec("kernels", [p for p in sys.path
                                             if os.path.abspath(p or ".") != _root])
    if _spec is None or _spec.loader is None:
        # Not installed. transformers asks for it by importing the name where its metadata is
        # missing, and an ImportError there ends its import (a 1.3B HF Llama on the H200,
        # transformers 5.17 without `kernels`): stay an empty module without a file or a
        # version, which it reads as a folder shadowing the name, not an install.
        __file__ = None

        def __getattr__(name: str):
            raise AttributeError(f"Hugging Face's kernels package is not installed, so "
                                 f"kernels.{name} does not exist (this checkout's kernels/ "
                                 f"folder imports as gputune_kernels)")
    else:
        _module = module_from_spec(_spec)
        sys.modules["kernels"] = _module
        _spec.loader.exec_module(_module)
else:
    from gputune_kernels._api import *  # noqa: F401,F403
    from gputune_kernels._api import KERNEL_NAMES, __all__, available  # noqa: F401
