"""The base of every record that crosses a stage or a file: immutable, strict, built lazily."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """Frozen, rejects unknown fields; validators are built on first use (fast CLI start-up)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
