"""What the start-up hook installs in every process of a script trial: the lifeline, post-import
patches of the training entry points, and the hooks that record how the script ended.

Only the standard library is imported here: launchers (torchrun, ``accelerate launch``,
``deepspeed``) run it too, and a patch only acts when its entry point is called.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType, TracebackType
from typing import Any

# module -> the function that patches it once it has been executed.
_PATCHES: dict[str, Callable[[ModuleType], None]] = {}
# Processes that only launch the ranks: they import entry-point packages but train nothing.
_LAUNCHERS = ("torch.distributed.run", "accelerate.commands", "deepspeed.launcher")


def _patches() -> dict[str, Callable[[ModuleType], None]]:
    from autotune.runtime.trial.script import _inject

    return {
        "transformers.training_args": _inject.patch_training_arguments,
        "transformers.trainer": _inject.patch_trainer,
        "deepspeed": _inject.patch_deepspeed,
        "accelerate.accelerator": _inject.patch_accelerator,
    }


class _PostImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a patched module so the patch runs right after
    the module's own code, before anyone can bind the unpatched names."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                # Not popped here: find_spec alone (is_deepspeed_available()) imports nothing.
                _wrap_loader(spec, name)
                return spec
        return None


def _wrap_loader(spec: importlib.machinery.ModuleSpec, name: str) -> None:
    loader: Any = spec.loader
    original = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        original(module)
        patch = _PATCHES.pop(name, None)
        if patch is not None:
            patch(module)

    loader.exec_module = exec_module


def is_launcher() -> bool:
    """Whether this process is a launcher (its ``__main__`` is one of theirs), not a rank."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", "") or ""
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name.startswith(_LAUNCHERS) or argv0 in ("torchrun", "accelerate", "deepspeed")


def install(spec_path: str) -> None:
    """Guard this process, patch the entry points on import, record how the script ends."""
    if "autotune.runtime.trial.lifeline" in sys.orig_argv[:4]:
        return  # the lifeline guards itself, then execs the launch (which runs this again)
    from autotune.runtime.trial.lifeline import die_with_parent

    die_with_parent()
    _PATCHES.update(_patches())
    for name in list(_PATCHES):
        module = sys.modules.get(name)
        if module is not None:  # imported before us (only by another start-up hook)
            _PATCHES.pop(name)(module)
    sys.meta_path.insert(0, _PostImport())
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not is_launcher():
            from autotune.runtime.trial.script._measure import record_crash

            record_crash(exc)
        previous(kind, exc, tb)

    sys.excepthook = excepthook
    thread_previous = threading.excepthook

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not is_launcher():
            from autotune.runtime.trial.script._measure import record_crash

            record_crash(args.exc_value)
        thread_previous(args)

    threading.excepthook = thread_hook
    atexit.register(_at_exit)


def _at_exit() -> None:
    if is_launcher():
        return
    from autotune.runtime.trial.script._measure import record_exit

    record_exit()
