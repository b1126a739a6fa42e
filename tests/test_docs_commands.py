"""Every ``autotune`` command README.md and docs/ show, held to the CLI itself.

Each command line of a code block (fenced, or indented four spaces), and each inline
`` `autotune ...` `` span, is read word by word against the command objects typer builds: the
command exists, every flag is one of its options (a hidden, renamed one is not), every value
given to a choice option is one of its choices, a number is a number in range, and no more
positional words are given than it takes. Synopsis lines (``[--top N]``, ``a|b``, ``MODEL.py``)
are read the same way, option by option. A command page's inline `` `--flag value` `` spans
are that command's options. The cheap commands (``config``, ``suggest``, ``--help``) run.

The help texts are held too: a help several commands share names only flags each of them
takes, every ``--hf-config`` names what its loader reads, a path a help names is there, and
docs/README.md names the commands without ``--json``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from _profiles import synthetic_profile
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.testing import CliRunner

from autotune.cli import COMMANDS, app
from autotune.emit import code_changes_for
from autotune.records import Recommendation, parse_plan, write_record

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
SHELL_ENDS = {"&", "&&", ";", "||", "done", "wait"}
SKIPPED = {"|", "...", "…"}
OTHER_PROGRAMS = {"--deepspeed", "--deepspeed_config", "--output_dir"}
"""Flags a page's inline spans give to the user's own script or torchrun, not to autotune."""
RUNS = {"config", "suggest"}
"""Commands cheap enough to run as the docs write them (no model built, no trial)."""


@dataclass(frozen=True)
class Shown:
    """One command as a page shows it: where, and its words after ``autotune``."""

    where: str
    words: tuple[str, ...]
    kind: str = "code"
    """``code`` (a code block), ``inline`` (an `` `autotune ...` `` span), or ``option`` (an
    inline `` `--flag ...` `` span: the page's command's, or where it lacks the flag, another's)."""

    def __str__(self) -> str:
        return f"{self.where}: autotune {shlex.join(self.words)}"


def _code_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines of fenced and indented code blocks: continuations (``\\``) joined, and a
    synopsis's lines too (a line that starts with ``[`` or ``-`` goes on the one above)."""
    fenced, shell, indented, previous_blank = False, False, False, True
    lines: list[tuple[int, str]] = []
    joining = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, lines, joining = not fenced, [*lines, (number, "")], False
            shell = line.strip("` \n") in SHELL_FENCES
            continue
        indented = bool(line.startswith("    ") and (indented or previous_blank))
        previous_blank = not line.strip()
        if not ((fenced and shell) or (indented and not fenced)):
            lines.append((number, ""))
            continue
        word = line.strip()
        if lines and lines[-1][1] and (joining or word.startswith(("[", "-"))):
            lines[-1] = (lines[-1][0], lines[-1][1] + " " + word)
        else:
            lines.append((number, word))
        joining = word.endswith("\\")
        if joining:
            lines[-1] = (lines[-1][0], lines[-1][1][:-1])
    yield from ((number, line) for number, line in lines if line)


def _words(line: str) -> list[str]:
    """Shell words, a ``$(...)`` substitution as one placeholder, comments dropped."""
    line = re.sub(r"\$\([^()]*\)", "SUBSTITUTED", line)
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unclosed quote in prose-like text: not a command
        return []


def _commands_in(line: str) -> Iterator[tuple[str, ...]]:
    """The words after each ``autotune`` (or ``.../autotune``) of a line, to the shell's end."""
    words = _words(line)
    for i, word in enumerate(words):
        if word != "autotune" and not word.endswith("/autotune"):
            continue
        rest = words[i + 1 :]
        end = next((j for j, w in enumerate(rest) if w in SHELL_ENDS or w.endswith(";")), None)
        if rest[:end]:
            yield tuple(rest[:end])


def shown_commands() -> list[Shown]:
    """Every command of every page's code blocks and inline ``autotune`` spans, and every
    inline ``--flag`` span of a command's own page."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(REPO).as_posix()
        for number, line in _code_lines(text):
            found += [Shown(f"{name}:{number}", words) for words in _commands_in(line)]
        for number, line in enumerate(text.splitlines(), 1):
            for span in re.findall(r"`(autotune [^`]+)`", line):
                found += [Shown(f"{name}:{number}", w, "inline") for w in _commands_in(span)]
            if page.parent.name == "docs" and page.stem in COMMANDS:
                for span in re.findall(r"`(--?[a-z][^`]*)`", line):
                    words = _words(span)
                    if words and words[0].split("=")[0] not in OTHER_PROGRAMS:
                        found.append(Shown(f"{name}:{number}", (page.stem, *words), "option"))
    return found


def _group() -> TyperGroup:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    return group


def _commands() -> dict[str, TyperCommand]:
    """The root's commands by name."""
    commands = _group().commands
    typed = {name: c for name, c in commands.items() if isinstance(c, TyperCommand)}
    assert len(typed) == len(commands)
    return typed


def _options(command: TyperCommand | TyperGroup) -> dict[str, TyperOption]:
    """Every visible option of ``command`` by each of its flags (not ``--help``, which click adds)."""
    return {
        flag: param
        for param in command.params
        if isinstance(param, TyperOption) and not param.hidden
        for flag in (*param.opts, *param.secondary_opts)
    }


def _value_problem(command: TyperCommand, option: TyperOption, value: str) -> str | None:
    """Why ``value`` cannot be given to ``option`` (``a|b`` are alternatives), or ``None``."""
    kind = option.type_descriptor
    if kind.is_choice:
        choices = [str(getattr(c, "value", c)) for c in kind.choices or ()]
        wrong = [v for v in value.split("|") if v not in choices]
        return f"{wrong} not among {choices}" if wrong else None
    if kind.annotation not in (int, float) or not re.search(r"\d", value):
        return None  # text, or a placeholder such as N
    try:
        option.get_runtime_param().coerce(value, param=option, ctx=typer.Context(command))
    except typer.BadParameter as exc:
        return exc.format_message()
    return None


def _read(command: TyperCommand, words: list[str]) -> list[str]:
    """What is wrong in ``words`` for ``command``: unknown flags, values, too many positionals."""
    options, problems, positionals = _options(command), [], []
    i = 0
    while i < len(words):
        word = words[i].strip("[]")
        i += 1
        if word == "--":
            break  # the user's own command follows
        if word in SKIPPED or not word:
            continue
        if not word.startswith("-") or word == "-":
            positionals.append(word)
            continue
        flag, _, attached = word.partition("=")
        if flag == "--help":
            continue
        option = options.get(flag)
        if option is None:
            problems.append(f"{flag}: not an option of `autotune {command.name}`")
            continue
        if option.is_flag or option.count:
            continue
        value = attached or (words[i].strip("[]") if i < len(words) else "")
        i += 0 if attached else 1
        problem = _value_problem(command, option, value)
        if problem:
            problems.append(f"{flag} {value}: {problem}")
    takes = [p.nargs for p in command.params if isinstance(p, TyperArgument)]
    if -1 not in takes and len(positionals) > sum(takes):
        problems.append(f"{positionals}: takes {sum(takes)} positional word(s)")
    return problems


def problems_of(shown: Shown) -> list[str]:
    """What ``shown`` gets wrong about the CLI (root options, then the command's)."""
    group, commands, words = _group(), _commands(), list(shown.words)
    while words and words[0].startswith("-"):
        flag = words.pop(0)
        if flag not in {*_options(group), "--help"}:
            return [f"{flag}: not an option of `autotune`"]
    if not words or words[0] in SKIPPED:
        return []
    command = commands.get(words[0])
    if command is None:
        return [f"{words[0]}: no such command"]
    if shown.kind == "option" and words[1] not in _options(command):
        flag = words[1].split("=")[0]
        command = next((c for c in commands.values() if flag in _options(c)), command)
    return _read(command, words[1:])


SHOWN = shown_commands()


def test_the_pages_show_commands_of_every_kind() -> None:
    named = {s.words[0] for s in SHOWN if not s.words[0].startswith("-")}
    assert set(COMMANDS) <= named, f"no command shown for {set(COMMANDS) - named}"
    assert len(SHOWN) > 50


@pytest.mark.parametrize("shown", SHOWN, ids=str)
def test_each_shown_command_is_one_the_cli_takes(shown: Shown) -> None:
    assert problems_of(shown) == [], str(shown)


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (("estimate", "m.py", "--autocast", "fp32"), "--autocast fp32: ['fp32'] not among"),
        (("estimate", "--hf-model", "x"), "--hf-model: not an option of `autotune estimate`"),
        (("estimate", "--world-size", "8"), "--world-size: not an option"),
        (("agent", "--study", "s", "--json"), "--json: not an option of `autotune agent`"),
        (("estimate", "--margin", "2"), "--margin 2:"),
        (("suggest", "a.json", "b.json"), "takes 1 positional"),
        (("nosuch",), "nosuch: no such command"),
    ],
)
def test_a_wrong_command_is_named(words: tuple[str, ...], problem: str) -> None:
    assert any(problem in line for line in problems_of(Shown("page.md:1", words)))


def test_the_repository_files_a_command_names_are_there() -> None:
    named = {(s.where, w) for s in SHOWN for w in s.words if w.startswith(("examples/", "bench/"))}
    assert named and sorted(n for n in named if not (REPO / n[1]).exists()) == []


def _runnable(shown: Shown) -> bool:
    words = shown.words
    if words[0] not in RUNS or shown.kind != "code":
        return False
    return not any(w in SKIPPED or w.startswith("[") or w.isupper() for w in words)


def _files(folder: Path) -> None:
    """The files the runnable commands read, as the loop before them would have left them."""
    write_record(folder / "autotune-profile.json", synthetic_profile(device="cuda"))
    plan = parse_plan("stage=2,mb=4,ga=8,precision=bf16,nproc_per_node=8")
    write_record(folder / "recommendation.json",
                 Recommendation(source="tune", plan=plan, code_changes=code_changes_for(plan)))  # fmt: skip
    (folder / "my_ds.json").write_text('{"gradient_clipping": 1.0}\n', encoding="utf-8")


RUNNABLE = [s for s in SHOWN if _runnable(s)]


@pytest.mark.parametrize("shown", RUNNABLE, ids=str)
def test_cheap_commands_run_as_written(
    shown: Shown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, list(shown.words))
    assert result.exit_code == 0, f"{shown}\n{result.output}"


@pytest.mark.parametrize("name", sorted({s.words[0] for s in SHOWN} & set(COMMANDS)))
def test_help_of_each_shown_command(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output


def _helps() -> dict[str, dict[str, str]]:
    """Each command's option help texts, by option name."""
    return {name: {p.name or "": p.help or "" for p in command.params if isinstance(p, TyperOption)}
            for name, command in _commands().items()}  # fmt: skip


def test_a_help_several_commands_share_names_only_flags_each_takes() -> None:
    commands, users = _commands(), dict[str, set[str]]()
    for name, helps in _helps().items():
        for text in helps.values():
            users.setdefault(text, set()).add(name)
    wrong = [
        (flag, name, text)
        for text, names in users.items()
        if len(names) > 1
        for flag in re.findall(r"(?<![\w=-])--[a-z][a-z0-9-]*", re.sub(r"`[^`]*`", "", text))
        for name in sorted(names)
        if flag not in _options(commands[name])
    ]
    assert wrong == []


def test_every_hf_config_help_names_what_the_loader_reads() -> None:
    # autotune.runtime.hf.load_config: a config.json, a model directory, or a Hub name
    helps = {name: h["hf_config"] for name, h in _helps().items() if "hf_config" in h}
    assert set(helps) >= {"profile", "estimate", "confirm", "tune"}
    for name, text in helps.items():
        assert all(form in text for form in ("config.json", "directory", "Hub")), (name, text)


def test_a_path_a_help_names_is_there() -> None:
    named = [
        (name, option, path)
        for name, helps in _helps().items()
        for option, text in helps.items()
        for path in re.findall(r"[\w.-]+(?:/[\w.-]+)+\.(?:toml|json|yaml|py)", text)
    ]
    assert [n for n in named if not (REPO / n[2]).is_file()] == []


def test_the_commands_said_to_take_json_do() -> None:
    text = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    said = re.search(r"Every command (?:but (.+?) )?takes `--json`", text)
    assert said, "docs/README.md no longer says which commands take --json"
    without = set(re.findall(r"`(\w+)`", said.group(1) or ""))
    commands = _commands()
    lacking = {n for n in COMMANDS if "--json" not in _options(commands[n])}
    assert lacking == without, f"docs/README.md says {without or 'none'} lack --json: {lacking} do"
