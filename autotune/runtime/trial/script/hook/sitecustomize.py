"""autotune's start-up hook for script trials (on PYTHONPATH only while a trial runs).

Runs in every Python process of the launch; does nothing unless AUTOTUNE_SCRIPT_SPEC is set.
A ``sitecustomize`` further down the path (a distribution's own) still runs, after this one.
"""

import contextlib
import os
import sys


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path, the one this file shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    module = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        with contextlib.suppress(ImportError):
            import sitecustomize  # noqa: F401
    finally:
        sys.path[:] = saved
        if module is not None:
            sys.modules["sitecustomize"] = module


if os.environ.get("AUTOTUNE_SCRIPT_SPEC"):
    from autotune.runtime.trial.script._boot import install

    install(os.environ["AUTOTUNE_SCRIPT_SPEC"])
_chain()
