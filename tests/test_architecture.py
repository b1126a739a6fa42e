"""The layout is the architecture: import contracts, no cycles, and a wheel that works alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import grimp
import pytest
from _profiles import synthetic_profile

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under ``root`` with the contracts of ``root/pyproject.toml``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_contracts_hold() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "6 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # the estimator may not call the composer above it
        ("estimator/_zero.py", "import autotune.api\n", "Stages import only the stages below"),
        # torch only under runtime
        ("emit/_changes.py", "import torch\n", "torch, DeepSpeed and NVML only under"),
        # a private module of another package
        ("search/_space.py", "import autotune.policy._facts\n", "private module is imported only"),
        # the trial processes are the composer's to wire in, not the CLI's
        ("cli/tune.py", "import autotune.runtime.trial.entry_points\n", "Only the composer wires"),
        # the trial processes share the protocol in records, not the search itself
        ("runtime/trial/steps.py", "import autotune.search\n", "The runtime does not import"),
    ],
)
def test_a_deliberate_violation_breaks_a_contract(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        REPO / "autotune", tmp_path / "autotune", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "autotune" / module
    target.write_text(line + target.read_text())
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    assert f"{broken}" in done.stdout and "BROKEN" in done.stdout


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), i.e. import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module) & modules:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_modules() -> None:
    graph = grimp.build_graph("autotune", cache_dir=None)
    # A package's __init__ re-exports its modules, so it is left out: an import of the
    # package from inside it is an import of the one module it names.
    packages = {m for m in graph.modules if graph.find_children(m)}
    modules = {m for m in graph.modules if m.startswith("autotune.")} - packages
    assert _cycles(graph, modules) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph, {"p.a", "p.b", "p.c"}) == [["p.a", "p.b"]]


@pytest.mark.slow
def test_the_wheel_carries_the_default_policy_and_suggest_runs_from_it(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(REPO)],
        check=True, timeout=300,
    )  # fmt: skip
    wheel = next((tmp_path / "dist").glob("autotune_advisor-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        assert "autotune/policy/default.toml" in archive.namelist()
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    profile = tmp_path / "profile.json"
    profile.write_text(synthetic_profile().model_dump_json())
    # -S: no site processing, so this venv's editable install of the source tree is not seen;
    # the wheel's copy comes first and the dependencies come from this venv's site-packages.
    script = (
        "import sys, autotune; from autotune.cli import main\n"
        f"assert autotune.__file__.startswith({str(site)!r}), autotune.__file__\n"
        f"sys.argv = ['autotune', 'suggest', {str(profile)!r}, '--json']\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{site}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout)
    assert record["policy"].endswith("autotune/policy/default.toml")
    assert record["policy"].startswith(str(site))


def test_the_search_names_no_runtime_module_even_as_a_string() -> None:
    # The layers contract sees imports; a module launched by name (python -m ...) it cannot.
    # The search gets those names from the composer (EntryPoints), so none is written there.
    found = [f"{path.relative_to(REPO)}:{number}"
             for path in sorted((REPO / "autotune" / "search").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if "autotune.runtime" in line or "autotune/runtime" in line]  # fmt: skip
    assert found == []


def test_every_path_the_layout_page_names_exists() -> None:
    import re

    # The layout page (docs/layout.md), or the README's Layout section where it still is.
    page = REPO / "docs" / "layout.md"
    text = (page if page.exists() else REPO / "README.md").read_text(encoding="utf-8")
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0] if "## Layout" in text else text
    named = set(re.findall(r"`(autotune/[\w/.]+)`", layout))
    assert len(named) > 15
    assert sorted(path for path in named if not (REPO / path).exists()) == []
    # and every stage folder is named
    stages = {f"autotune/{p.name}/" for p in (REPO / "autotune").iterdir()
              if p.is_dir() and not p.name.startswith("_")}  # fmt: skip
    assert stages <= named
