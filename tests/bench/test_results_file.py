"""bench/RESULTS.md names the commit it was printed at, and every section's command still runs.

The fast tests read the file and the bench scripts' source only: each ``bench/*.py`` command's
options are parsed by a parser rebuilt from the script's own ``add_argument`` calls (its AST,
nothing imported or run). The slow test asks each script's real ``--help``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "RESULTS.md"
CHANGELOG = REPO / "bench" / "CHANGELOG.md"
CLOSING = "Reprinted and retired at this commit"
"""The closing note: a list of sections, not a question, so it has no command."""
TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "Path": Path}
LITERAL_KEYWORDS = ("action", "nargs", "choices", "required")


def sections() -> dict[str, str]:
    """Each ``## `` section's body by its title, the closing note left out."""
    parts = re.split(r"^## (.+)$", RESULTS.read_text(encoding="utf-8"), flags=re.MULTILINE)
    bodies = dict(zip(parts[1::2], parts[2::2], strict=True))
    return {title: body for title, body in bodies.items() if title != CLOSING}


def commands(body: str) -> list[str]:
    """The lines of a section's ``sh`` fences: one command per line."""
    fences = re.findall(r"^(`{3,})sh\n(.*?)\n\1$", body, flags=re.MULTILINE | re.DOTALL)
    return [line for _, block in fences for line in block.splitlines() if line.strip()]


def bench_call(command: str) -> tuple[Path, list[str]] | None:
    """The ``bench/NAME.py`` script a command runs and the arguments after it, if it runs one."""
    words = shlex.split(command)
    for index, word in enumerate(words):
        if re.fullmatch(r"bench/[\w-]+\.py", word):
            return REPO / word, words[index + 1 :]
    return None


def _add_argument_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
    ]


def rebuilt_parser(script: Path) -> argparse.ArgumentParser | None:
    """The script's argument parser from its ``add_argument`` calls (and those of the private
    ``bench/_*.py`` helpers it imports); ``None`` when it has none, so takes no options."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    calls = _add_argument_calls(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("_"):
            helper = script.parent / f"{node.module}.py"
            if helper.exists():
                calls += _add_argument_calls(ast.parse(helper.read_text(encoding="utf-8")))
    if not calls:
        return None
    parser = argparse.ArgumentParser(prog=script.name, exit_on_error=False)
    for call in calls:
        names = [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
        options: dict[str, object] = {}
        for keyword in call.keywords:
            if keyword.arg in LITERAL_KEYWORDS:
                options[keyword.arg] = ast.literal_eval(keyword.value)
            elif keyword.arg == "type" and isinstance(keyword.value, ast.Name):
                options["type"] = TYPES.get(keyword.value.id, str)
        parser.add_argument(*names, **options)  # type: ignore[arg-type]
    return parser


def refusal(script: Path, arguments: list[str]) -> str | None:
    """Why the script would refuse these arguments, or ``None`` when it takes them."""
    parser = rebuilt_parser(script)
    if parser is None:
        return f"takes no options: {arguments}" if arguments else None
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parser.parse_args(arguments)
    except (SystemExit, argparse.ArgumentError) as error:
        return said.getvalue().strip() or str(error)
    return None


def test_the_header_names_a_commit_of_this_history() -> None:
    head = "\n".join(RESULTS.read_text(encoding="utf-8").splitlines()[:5])
    found = re.search(r"at commit `([0-9a-f]{7,40})`", head)
    assert found, "the header names no commit (at commit `SHA`)"
    ancestor = subprocess.run(
        ["git", "--no-optional-locks", "merge-base", "--is-ancestor", found[1], "HEAD"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert ancestor.returncode == 0, f"{found[1]} is not in git log: {ancestor.stderr}"


def test_every_section_has_a_command_that_runs_a_bench_script() -> None:
    assert sections(), "no ## sections"
    for title, body in sections().items():
        calls = [bench_call(line) for line in commands(body)]
        scripts = [call[0] for call in calls if call is not None]
        assert scripts, f"{title}: no command naming a bench/*.py script in an sh fence"
        for script in scripts:
            assert script.exists(), f"{title}: {script.relative_to(REPO)} does not exist"


def test_every_bench_command_is_accepted_by_its_script() -> None:
    refused = []
    for title, body in sections().items():
        for line in commands(body):
            call = bench_call(line)
            if call is not None and (why := refusal(*call)) is not None:
                refused.append(f"{title}: {line}\n  {why}")
    assert not refused, "\n".join(refused)


def test_no_command_uses_the_removed_skip_torch() -> None:
    used = [
        line for body in sections().values() for line in commands(body) if "--skip-torch" in line
    ]
    assert not used


def test_every_changelog_section_pointed_to_exists() -> None:
    headings = set(CHANGELOG.read_text(encoding="utf-8").splitlines())
    pointed = re.findall(r"^- “(#{2,3} .+)”$", RESULTS.read_text(encoding="utf-8"), re.MULTILINE)
    assert pointed, "no pointer to bench/CHANGELOG.md"
    assert not [heading for heading in pointed if heading not in headings]


@pytest.mark.parametrize(
    ("script", "arguments", "refused"),
    [
        (
            "zero_peaks.py",
            ["examples/gpt2_small.py", "--no-trial", "--plans", "stage=2,mb=1"],
            False,
        ),
        ("zero_peaks.py", ["examples/gpt2_small.py", "--skip-torch", "--plans", "stage=2"], True),
        (
            "zero_peaks.py",
            ["examples/tiny_llama.py", "--device", "tpu", "--plans", "stage=2"],
            True,
        ),
        ("zero_peak_spread.py", ["--repeats", "five"], True),
        ("bf16_peaks.py", ["--hf-config", "examples/zoo/bert.json", "--plans", "stage=1"], False),
        ("bf16_peaks.py", ["examples/tiny_llama.py"], True),  # --plans is required
        ("gloo_hold.py", [], False),
        ("gloo_hold.py", ["--rounds", "5"], True),
    ],
)
def test_the_rebuilt_parser_refuses_what_the_script_would(
    script: str, arguments: list[str], refused: bool
) -> None:
    assert (refusal(REPO / "bench" / script, arguments) is not None) is refused


@pytest.mark.slow
def test_every_command_option_is_in_its_scripts_help() -> None:
    autotune = Path(sys.executable).parent / "autotune"
    missing = []
    for title, body in sections().items():
        for line in commands(body):
            words = shlex.split(line)
            call = bench_call(line)
            if call is not None and rebuilt_parser(call[0]) is not None:
                helped = [sys.executable, str(call[0]), "--help"]
                arguments = call[1]
            elif call is None and any(Path(w).name == "autotune" for w in words):
                at = next(i for i, w in enumerate(words) if Path(w).name == "autotune")
                helped, arguments = [str(autotune), words[at + 1], "--help"], words[at + 2 :]
            else:
                continue
            shown = subprocess.run(
                helped, cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
                env={**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"},
            ).stdout  # fmt: skip
            for option in (a.split("=")[0] for a in arguments if a.startswith("--")):
                if not re.search(re.escape(option) + r"(?![\w-])", shown):
                    missing.append(f"{title}: {option} not in `{' '.join(helped[-2:])}`")
    assert not missing, "\n".join(missing)
