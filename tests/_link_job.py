"""The shaped-link job: a network namespace of its own and two torchrun "nodes" of
``_link_rank.py`` in it; shared by ``runtime/test_shaped_link.py`` and ``bench/shaped_link.py``.

Everything runs inside the namespace on its loopback (127.0.0.1 only), which rank 0 shapes
with ``tc`` tbf. Each node is its own process group; torchrun starts its worker in a session of
its own, so what outlives a job is found by the namespace (``ip netns pids``) and killed by id.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from autotune.records import LinkMeasure

TESTS = Path(__file__).resolve().parent
RDZV_PORT = 29517
IP_TIMEOUT_S = 10


def shaped_sweeps(results: Mapping[str, Any]) -> list[LinkMeasure]:
    """The job's sweeps of the shaped link, before and after its windows (a file from before
    the second was taken has one): a prediction is the mean of the two, each a few seconds
    of a host whose load moves the fitted bandwidth by several percent."""
    keys = ("sweep_shaped", "sweep_shaped_after")
    return [LinkMeasure.model_validate(results[key]) for key in keys if key in results]


class LinkJobError(RuntimeError):
    """The 2-node job failed or ran past its deadline; the message ends with both nodes' logs."""


def namespace_problem() -> str | None:
    """Why a namespace cannot be made here (not root, ``ip`` or ``tc`` missing), else ``None``."""
    if os.geteuid() != 0:
        return "a network namespace needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (Debian: apt-get install iproute2)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=IP_TIMEOUT_S)


@contextlib.contextmanager
def link_namespace() -> Iterator[str]:
    """A network namespace of the caller's own, its loopback up; what still runs in it is
    killed and the namespace deleted at the end, also on error or Ctrl-C."""
    name = f"autotune-link-{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", name)
    try:
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name
    finally:
        kill_namespace_processes(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=IP_TIMEOUT_S)


def kill_namespace_processes(namespace: str) -> None:
    """SIGKILL every process still in ``namespace`` (only the job's own run there)."""
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                            timeout=IP_TIMEOUT_S)  # fmt: skip
    for pid in (int(word) for word in listed.stdout.split() if word.isdigit()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_job(
    namespace: str,
    out: Path,
    rate: str,
    plans: Mapping[str, str],
    *,
    timeout_s: float,
    port: int = RDZV_PORT,
    rounds: int | None = None,
    sweep_tries: int = 1,
) -> dict[str, Any]:
    """Both nodes' torchrun inside ``namespace``, each in its own process group, killed (and
    whatever they started) if the job outlives ``timeout_s`` or the caller stops.

    Args:
        namespace: from :func:`link_namespace`.
        out: the JSON rank 0 writes; the nodes' logs go beside it (``.node0.log``, ``.node1.log``).
        rate: the tbf rate of the shaped windows (tc's syntax: ``1gbit``).
        plans: ``NAME -> KNOBS`` as ``_link_rank.py`` takes them.
        timeout_s: the deadline of the whole job (rendezvous, sweeps and every plan).
        port: the c10d rendezvous port on the namespace's 127.0.0.1.
        rounds: shaped/open window pairs per plan (``None``: ``_link_rank.py``'s default).
        sweep_tries: sweeps of each kind before a fit that refuses its points fails the job.

    Returns:
        The results rank 0 wrote.

    Raises:
        LinkJobError: a node exited non-zero or the job ran past ``timeout_s``.
    """
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=str(TESTS.parent))  # fmt: skip
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/autotune-torch-extensions"))
    env.pop("RANK", None)
    command = ["ip", "netns", "exec", namespace, sys.executable, "-m", "torch.distributed.run",
               "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={namespace}-{port}",
               "--max-restarts=0", "--local-addr=127.0.0.1", "--rdzv-conf=join_timeout=60",
               f"--log-dir={out.parent / 'torchrun'}", str(TESTS / "_link_rank.py"), str(out), rate,
               *([] if rounds is None else [f"--rounds={rounds}"]),
               *([] if sweep_tries == 1 else [f"--sweep-tries={sweep_tries}"]),
               *(f"{name}={knobs}" for name, knobs in plans.items())]  # fmt: skip
    logs = [out.with_suffix(f".node{i}.log") for i in range(2)]
    nodes: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        for log in logs:
            with log.open("w") as handle:
                nodes.append(subprocess.Popen(command, env=env, stdout=handle, stderr=handle,
                                              start_new_session=True))  # fmt: skip
        for node in nodes:
            try:
                node.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise LinkJobError(
                    f"the 2-node job ({rate}: link sweeps and {len(plans)} plans) ran past "
                    f"{timeout_s:.0f} s: {tail(logs)}"
                ) from None
            if node.returncode != 0:
                raise LinkJobError(f"a node exited with {node.returncode}: {tail(logs)}")
    finally:
        left = [node for node in nodes if node.poll() is None]
        for node in left:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=10)  # SIGKILLed: gone at once
        if left:  # torchrun's workers run in sessions of their own
            kill_namespace_processes(namespace)
    results: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return results


def tail(logs: list[Path]) -> str:
    """The last lines of each node's log, for a failure message."""
    return "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}" for log in logs)
