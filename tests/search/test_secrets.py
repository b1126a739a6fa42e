"""A database password stays out of everything autotune prints or writes: a real `autotune
tune` on the session's real PostgreSQL server with a password in its URL, then the same
study through ``$AUTOTUNE_STORAGE``, then `autotune report` on its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _models import TINY_MLP_FILE

from autotune.search._study import STORAGE_ENV, shown_storage, storage_url

pytestmark = pytest.mark.slow
PASSWORD = "pw-0ddS3cret-25"
MODEL = TINY_MLP_FILE
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))


def _with_password(url: str) -> str:
    # The test server trusts local connections: the password is sent, and never checked.
    scheme, rest = url.split("://", 1)
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:{PASSWORD}@{host}"


def _everything_written(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_the_password_appears_nowhere(postgres_url: str, tmp_path: Path) -> None:
    url = _with_password(postgres_url)
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "out").mkdir()
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1",
           "DS_ACCELERATOR": "cpu"}  # fmt: skip
    env.pop(STORAGE_ENV, None)
    cmd = [AUTOTUNE, "tune", str(tmp_path / "model.py"), "--global-batch", "2", "--trials", "1",
           "--repeats", "0", "--steps", "1", "--warmup", "0", "--device", "cpu",
           "--study", "secret", "--out-dir", str(tmp_path / "out"), "--trial-timeout", "120"]  # fmt: skip
    table = subprocess.run([*cmd, "--storage", url], capture_output=True, text=True, env=env,
                           timeout=600)  # fmt: skip
    assert table.returncode == 0, table.stderr[-3000:]
    # The same study again, its URL in the environment: resumed, as --json this time.
    env[STORAGE_ENV] = url
    as_json = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env,
                             timeout=600)  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    (tmp_path / "out" / "tune.json").write_text(as_json.stdout)
    report = subprocess.run([AUTOTUNE, "report", "--tune", str(tmp_path / "out" / "tune.json"),
                             "--out", str(tmp_path / "out" / "report.html")],
                            capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    shown = shown_storage(url)
    assert PASSWORD not in shown and shown.endswith(postgres_url.split("@", 1)[1])
    assert f"({shown})" in table.stdout.replace("\n", "").replace(" ", "") or shown in table.stdout
    assert f'"storage": "{shown}"' in as_json.stdout
    everything = [table.stdout, table.stderr, as_json.stdout, as_json.stderr, report.stdout,
                  report.stderr, _everything_written(tmp_path)]  # fmt: skip
    assert all(PASSWORD not in text for text in everything)
    # The report opened the study behind the masked URL ($AUTOTUNE_STORAGE's password).
    assert storage_url(shown) == storage_url(url) or os.environ.get(STORAGE_ENV) is None


@pytest.mark.slow
def test_agents_and_their_jobs_keep_the_password_out(postgres_url: str, tmp_path: Path) -> None:
    import optuna

    from autotune.search._runner import free_port

    url = _with_password(postgres_url)
    (tmp_path / "model.py").write_text(MODEL)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path)}  # fmt: skip
    env.pop(STORAGE_ENV, None)
    logs = [tmp_path / f"agent{i}.log" for i in range(2)]
    agents = []
    for log in logs:
        with log.open("wb") as err:
            agents.append(subprocess.Popen(
                [AUTOTUNE, "agent", "--storage", url, "--study", "agents", "--idle-timeout",
                 "300"], stdout=err, stderr=err, env=env, cwd=tmp_path))  # fmt: skip
    try:
        done = subprocess.run(
            [AUTOTUNE, "tune", str(tmp_path / "model.py"), "--global-batch", "2", "--nproc-per-node",
             "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--storage",
             url, "--study", "agents", "--trials", "1", "--repeats", "0", "--steps", "1",
             "--warmup", "0", "--device", "cpu", "--out-dir", str(tmp_path), "--json"],
            capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)  # fmt: skip
    finally:
        for agent in agents:
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    attrs = optuna.load_study(study_name="agents", storage=storage_url(url)).user_attrs
    assert any(key == "autotune:job" for key in attrs), "no job was posted"
    everything = [done.stdout, done.stderr, json.dumps(attrs), _everything_written(tmp_path)]
    assert all(PASSWORD not in text for text in everything)


def test_a_profile_taken_under_a_storage_url_keeps_its_command_without_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tune's profile is kept in its study (one set per study): its command line, the
    storage URL included, is recorded with the password masked."""
    from autotune.runtime.profiler import profile

    (tmp_path / "model.py").write_text(MODEL)
    argv = ["autotune", "tune", "model.py", "--storage", f"postgresql://me:{PASSWORD}@db:5432/s"]
    monkeypatch.setattr(sys, "argv", argv)
    record = profile(tmp_path / "model.py", batch_size=1, steps=1, warmup=0, device="cpu")
    assert record.provenance.command == (
        "autotune tune model.py --storage postgresql://me:***@db:5432/s"
    )
