"""The model a bench script measures: a model file, or a transformers config built into one."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``MODEL`` (a model file) or ``--hf-config`` with ``--seq-len``; ``--plans``; ``--nproc-per-node``."""
    parser.add_argument("model", nargs="?")
    parser.add_argument("--hf-config")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--plans", nargs="+", required=True)
    parser.add_argument("--nproc-per-node", type=int, default=2)


def parse_model_arguments(doc: str) -> argparse.Namespace:
    """A trial bench script's arguments (:func:`add_model_arguments`, its docstring's first line
    the description), after setting the CPU trial environment its worker groups inherit, where
    unset (one thread per rank, DeepSpeed's CPU accelerator)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_model_arguments(parser)
    return parser.parse_args()


def model_path(args: argparse.Namespace, work: Path) -> str:
    """The model file's absolute path; a ``--hf-config`` is written as one into ``work``."""
    if args.hf_config is None:
        return str(Path(args.model).resolve())
    from autotune.runtime.hf import hf_model_file

    text, _, stem = hf_model_file(hf_config=args.hf_config, seq_len=args.seq_len, task=None)
    path = work / f"{stem}.py"
    path.write_text(text, encoding="utf-8")
    return str(path)
