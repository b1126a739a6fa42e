"""The user's model file: loading it, calling its hooks, and turning every mistake into one line."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from autotune.records import AutotuneError

DEFAULT_LR = 1e-4
_PASS_THROUGH = (torch.OutOfMemoryError, MemoryError)
"""Out-of-memory is an outcome trials classify, not a mistake in the model file."""


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def user_line(exc: BaseException, path: Path) -> int | None:
    """The line of the last traceback frame inside the user's file, if any."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path:
            line = frame.lineno
    return line


class ModelFile:
    """A loaded model file. Build with :func:`load_model_file`."""

    def __init__(self, path: Path, module: ModuleType, sha256: str) -> None:
        self.path = path
        self.module = module
        self.sha256 = sha256

    def _where(self, line: int | None) -> str:
        return f"{self.path}:{line}" if line else str(self.path)

    def error(self, problem: str, line: int | None = None) -> AutotuneError:
        """An :class:`AutotuneError` of the form ``FILE[:LINE]: problem``."""
        return AutotuneError(f"{self._where(line)}: {problem}")

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call user code; an exception becomes one line with the user's line number.

        Args:
            what: what was being done, e.g. ``"build_model()"``.
            fn: the callable (user code, or code that runs user code).
        """
        try:
            return fn(*args, **kwargs)
        except _PASS_THROUGH:
            raise
        except (AutotuneError, StopIteration):
            raise
        except Exception as exc:
            problem = f"{what} raised {type(exc).__name__}: {_one_line(str(exc))}"
            raise self.error(problem, user_line(exc, self.path)) from exc

    def _hook(self, name: str) -> Callable[..., Any] | None:
        value = getattr(self.module, name, None)
        if value is not None and not callable(value):
            raise self.error(f"{name} must be a function, not {type(value).__name__}")
        return value

    def build_model(self) -> nn.Module:
        """Call ``build_model()`` and check that the result is trainable."""
        model = self.call("build_model()", self.module.build_model)
        if not isinstance(model, nn.Module):
            raise self.error(
                f"build_model() returned {type(model).__name__}, not a torch.nn.Module"
            )
        if not any(p.requires_grad for p in model.parameters()):
            raise self.error("the model has no trainable parameters (all have requires_grad=False)")
        return model

    def build_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The user's ``build_optimizer(params)``, else AdamW."""
        hook = self._hook("build_optimizer")
        if hook is None:
            return torch.optim.AdamW(params, lr=DEFAULT_LR)
        optimizer = self.call("build_optimizer(params)", hook, params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            name = type(optimizer).__name__
            raise self.error(f"build_optimizer() returned {name}, not a torch.optim.Optimizer")
        return optimizer

    def batches(
        self, batch_size: int, *, workers: int | None = None, pin_memory: bool = False
    ) -> Iterator[Any]:
        """Endless batches of ``batch_size`` samples.

        Args:
            batch_size: samples per batch, passed to the user's hook.
            workers: DataLoader worker processes; a ``DataLoader`` from
                ``build_dataloader`` is rebuilt with it. ``None`` keeps the user's.
                Does nothing for ``build_batch``.
            pin_memory: pin host memory (only where CUDA is available).
        """
        build_batch = self._hook("build_batch")
        if build_batch is not None:
            return self._batch_stream(build_batch, batch_size)
        return self._loader_stream(batch_size, workers, pin_memory)

    def loader_knobs_blocked(self, batch_size: int) -> str | None:
        """Why DataLoader workers and pinned memory cannot be applied to this file automatically,
        with the code change that would let them (``None``: they can).

        Only a ``torch.utils.data.DataLoader`` from ``build_dataloader`` can be rebuilt with
        other ``num_workers``/``pin_memory``; a plain iterable or ``build_batch`` makes each
        batch in the training process, whatever the plan says.
        """
        change = ("put the per-sample work in a torch.utils.data.Dataset (or IterableDataset) and "
                  "return torch.utils.data.DataLoader(dataset, batch_size=batch_size, "
                  "num_workers=4, persistent_workers=True, pin_memory=True on CUDA) "
                  "from build_dataloader(batch_size)")  # fmt: skip
        if self._hook("build_batch") is not None:
            return f"build_batch() makes every batch in the training process; change: {change}"
        what = f"build_dataloader({batch_size})"
        hook = self._hook("build_dataloader")
        assert hook is not None  # load_model_file checked one of the two exists
        loader = self.call(what, hook, batch_size)
        if isinstance(loader, torch.utils.data.DataLoader):
            return None
        close = getattr(loader, "close", None)  # a generator that never ran
        if callable(close):
            close()
        return (f"{what} returns a {type(loader).__name__}, not a torch.utils.data.DataLoader, "
                f"so autotune cannot give it workers; change: {change}")  # fmt: skip

    def _batch_stream(self, hook: Callable[..., Any], batch_size: int) -> Iterator[Any]:
        while True:
            yield self.call(f"build_batch({batch_size})", hook, batch_size)

    def _loader_stream(self, batch_size: int, workers: int | None, pin: bool) -> Iterator[Any]:
        hook = self._hook("build_dataloader")
        assert hook is not None  # load_model_file checked one of the two exists
        what = f"build_dataloader({batch_size})"
        loader = self.call(what, hook, batch_size)
        if workers is not None or pin:
            loader = rebuild_loader(loader, workers, pin)
        if not isinstance(loader, Iterable):
            raise self.error(f"{what} returned {type(loader).__name__}, which is not iterable")
        while True:
            empty = True
            iterator = self.call(f"iterating {what}", iter, loader)
            while True:
                try:
                    batch = self.call(f"iterating {what}", next, iterator)
                except StopIteration:
                    break
                empty = False
                yield batch
            if empty:
                raise self.error(f"{what} yielded no batches")
            if isinstance(loader, Iterator):  # one-shot: ask the file for a fresh one
                loader = self.call(what, hook, batch_size)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The user's ``loss_fn(model, batch)``, else ``model(**batch).loss``; checked.

        Raises:
            AutotuneError: if forward or the loss raises, or the loss is not a
                finite scalar tensor connected to the parameters.
        """
        hook = self._hook("loss_fn")
        if hook is not None:
            value = self.call("loss_fn(model, batch)", hook, model, batch)
        elif isinstance(batch, Mapping):
            output = self.call("model(**batch)", model, **batch)
            value = getattr(output, "loss", None)
            if value is None and isinstance(output, Mapping):
                value = output.get("loss")
            if value is None:
                raise self.error("model(**batch) returned no .loss: define loss_fn(model, batch)")
        else:
            kind = type(batch).__name__
            raise self.error(
                f"the batch is a {kind}, and the default loss needs a dict (model(**batch).loss): "
                "define loss_fn(model, batch)"
            )
        return self._check_loss(value)

    def _check_loss(self, value: Any) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            raise self.error(f"the loss is a {type(value).__name__}, not a tensor")
        if value.numel() != 1:
            raise self.error(f"the loss is not a scalar (shape {tuple(value.shape)})")
        if not value.requires_grad:
            raise self.error("the loss does not require grad: it is not connected to any parameter")
        if not bool(torch.isfinite(value.detach()).all()):
            raise self.error(f"the loss is {value.item()} (not finite)")
        return value.reshape(())

    def tokens_per_sample(self, batch: Any) -> int | None:
        """Sequence length from ``batch["input_ids"]``, else ``TOKENS_PER_SAMPLE``, else None."""
        if isinstance(batch, Mapping):
            ids = batch.get("input_ids")
            if isinstance(ids, torch.Tensor) and ids.dim() >= 2:
                return int(ids.shape[-1])
        value = getattr(self.module, "TOKENS_PER_SAMPLE", None)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(f"TOKENS_PER_SAMPLE must be a positive int, not {value!r}")
        return value

    def move(self, batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
        """:func:`move_batch` with errors naming this file."""
        return move_batch(batch, device, non_blocking=non_blocking, source=str(self.path))


def move_batch(
    batch: Any, device: torch.device | str, *, non_blocking: bool = False, source: str | None = None
) -> Any:
    """Move a tensor, or a dict/list/tuple of them, to ``device``.

    Non-tensor leaves inside containers (ints, strings) pass through unchanged.

    Raises:
        AutotuneError: the batch itself is neither a tensor nor a container.
    """
    if isinstance(batch, torch.Tensor | Mapping | list | tuple):
        return _move(batch, device, non_blocking)
    where = source or "model file"
    raise AutotuneError(
        f"{where}: a batch of the wrong type ({type(batch).__name__}); "
        "expected a tensor, or a dict, list or tuple of tensors"
    )


def _move(value: Any, device: torch.device | str, non_blocking: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, Mapping):
        return {key: _move(item, device, non_blocking) for key, item in value.items()}
    if isinstance(value, list | tuple):
        moved = [_move(item, device, non_blocking) for item in value]
        return type(value)(moved) if not hasattr(value, "_fields") else type(value)(*moved)
    return value


def rebuild_loader(loader: Any, workers: int | None, pin_memory: bool) -> Any:
    """The same DataLoader with other ``num_workers``/``pin_memory``; other iterables unchanged."""
    if not isinstance(loader, torch.utils.data.DataLoader):
        return loader
    num_workers = loader.num_workers if workers is None else workers
    pin = pin_memory and torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        "collate_fn": loader.collate_fn,
        "num_workers": num_workers,
        "pin_memory": pin,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
    }
    if num_workers > 0:
        kwargs["persistent_workers"] = True
        kwargs["prefetch_factor"] = loader.prefetch_factor or 2
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(
            batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last
        )
    return torch.utils.data.DataLoader(loader.dataset, **kwargs)


_counter = itertools.count()


def load_model_file(path: str | Path) -> ModelFile:
    """Import a model file and check its contract.

    Raises:
        AutotuneError: the file is missing, does not import (with the user's
            line), or lacks ``build_model`` / ``build_batch`` or ``build_dataloader``.
    """
    source = Path(path).expanduser().resolve()
    if source.is_dir():
        raise AutotuneError(f"{path}: is a directory, not a model file")
    if not source.is_file():
        raise AutotuneError(f"{path}: no such model file")
    data = source.read_bytes()
    name = f"_autotune_model_{next(_counter)}_{source.stem}"
    module = _import(source, name)
    model_file = ModelFile(source, module, hashlib.sha256(data).hexdigest())
    if not callable(getattr(module, "build_model", None)):
        raise model_file.error("no build_model() function (required)")
    if not any(
        callable(getattr(module, hook, None)) for hook in ("build_batch", "build_dataloader")
    ):
        raise model_file.error("needs build_batch(batch_size) or build_dataloader(batch_size)")
    return model_file


def _import(source: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, source)
    if spec is None or spec.loader is None:
        raise AutotuneError(f"{source}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered so DataLoader workers and pickling can find classes defined in the file.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        suffix = f":{exc.lineno}" if exc.lineno else ""
        raise AutotuneError(f"{source}{suffix}: syntax error: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        line = user_line(exc, source)
        where = f"{source}:{line}" if line else str(source)
        problem = f"import failed: {type(exc).__name__}: {_one_line(str(exc))}"
        raise AutotuneError(f"{where}: {problem}") from exc
    return module
