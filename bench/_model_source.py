"""The model a bench script measures: a model file, or a transformers config built into one."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``MODEL`` (a model file) or ``--hf-config`` with ``--seq-len``; ``--plans``; ``--nproc-per-node``."""
    parser.add_argument("model", nargs="?")
    parser.add_argument("--hf-config")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--plans", nargs="+", required=True)
    parser.add_argument("--nproc-per-node", type=int, default=2)


def model_path(args: argparse.Namespace, work: Path) -> str:
    """The model file's absolute path; a ``--hf-config`` is written as one into ``work``."""
    if args.hf_config is None:
        return str(Path(args.model).resolve())
    from autotune.runtime.hf import hf_model_file

    text, _, stem = hf_model_file(hf_config=args.hf_config, seq_len=args.seq_len, task=None)
    path = work / f"{stem}.py"
    path.write_text(text, encoding="utf-8")
    return str(path)
