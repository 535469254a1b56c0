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
        raise ImportError("No module named 'kernels' (this checkout's kernels/ folder imports as "
                          "gputune_kernels)", name="kernels")
    _module = module_from_spec(_spec)
    sys.modules["kernels"] = _module
    _spec.loader.exec_module(_module)
else:
    from gputune_kernels._api import *  # noqa: F401,F403
    from gputune_kernels._api import KERNEL_NAMES, __all__, available  # noqa: F401
