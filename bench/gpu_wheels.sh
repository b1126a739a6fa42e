#!/usr/bin/env bash
# Fetch, on a machine with a package index, the wheels the GPU check needs on a GPU machine that
# has none: autotune's own dependencies (pyproject.toml, plus grimp, which the test collection
# imports) that its image lacks. That image has Python 3.12 with a CUDA torch, transformers,
# nvidia-ml-py, typer, rich, psutil, matplotlib, numpy, PyYAML, tqdm, pytest and accelerate.
# Writes .whl/ (about 15 MB; ignored by git); bench/gpu_check.sh installs from it.
# Versions: the ones checked together in this project's CI (PLATFORM.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rm -rf .whl && mkdir -p .whl
# Binary wheels for CPython 3.12 on x86-64 Linux, each dependency named (none resolved).
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 colorlog==6.12.0 mako==1.4.3 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 hjson==3.1.0 grimp==3.20
# DeepSpeed publishes only a source distribution: build its pure-Python wheel here (no ops
# are compiled; the check's trials use torch optimizers, so none is needed on the GPU).
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
ls -l .whl
