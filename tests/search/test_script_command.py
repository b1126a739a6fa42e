"""The launch command of a script trial: launchers recognised, ranks and port added where the
command names none, mapped flags set to the plan's values, bad commands refused in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.records import AutotuneError, Plan
from autotune.search import SCRIPT_SPEC_ENV, check_command, parse_arg_map, script_command

TWO = Plan(micro_batch=4, grad_accum=2, nproc_per_node=2)
ONE = Plan(micro_batch=4, grad_accum=2)


@pytest.mark.parametrize(
    ("command", "plan", "expected"),
    [
        (["python", "t.py", "--x"], ONE, ["python", "t.py", "--x"]),
        (["python", "t.py"], TWO, ["python", "-m", "torch.distributed.run", "--nnodes=1",
                                   "--nproc-per-node=2", "--master-addr=127.0.0.1",
                                   "--master-port=555", "t.py"]),
        (["torchrun", "t.py"], TWO, ["torchrun", "--nproc-per-node", "2", "--master-port", "555",
                                     "t.py"]),
        (["torchrun", "--nproc_per_node=2", "--master_port=9", "t.py"], TWO,
         ["torchrun", "--nproc_per_node=2", "--master_port=9", "t.py"]),
        (["torchrun", "--standalone", "--nproc-per-node", "2", "t.py"], TWO,
         ["torchrun", "--standalone", "--nproc-per-node", "2", "t.py"]),
        (["python", "-m", "torch.distributed.run", "t.py"], TWO,
         ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
          "555", "t.py"]),
        (["accelerate", "launch", "t.py"], TWO, ["accelerate", "launch", "--num_processes", "2",
                                                 "--main_process_port", "555", "t.py"]),
        (["deepspeed", "t.py"], TWO, ["deepspeed", "--num_gpus", "2", "--master_port", "555",
                                      "t.py"]),
    ],
)  # fmt: skip
def test_script_command_adds_ranks_and_port_only_where_missing(
    command: list[str], plan: Plan, expected: list[str]
) -> None:
    assert script_command(command, plan, 555, {}) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "t.py"], ["python", "-m", "torch.distributed.run", "--nnodes=1",
                              "--nproc-per-node=2", "--master-addr=127.0.0.1",
                              "--master-port=555", "--log-dir=/run/t/torchrun", "t.py"]),
        (["torchrun", "t.py"], ["torchrun", "--nproc-per-node", "2", "--master-port", "555",
                                "--log-dir=/run/t/torchrun", "t.py"]),
        (["torchrun", "--log_dir", "/mine", "t.py"],
         ["torchrun", "--nproc-per-node", "2", "--master-port", "555", "--log_dir", "/mine",
          "t.py"]),
        (["accelerate", "launch", "t.py"], ["accelerate", "launch", "--num_processes", "2",
                                            "--main_process_port", "555", "t.py"]),
    ],
)  # fmt: skip
def test_torchrun_logs_go_to_the_trials_folder_unless_the_command_names_its_own(
    command: list[str], expected: list[str]
) -> None:
    # torchrun's default is a torchelastic_* folder in /tmp per launch, never removed
    assert script_command(command, TWO, 555, {}, log_dir=Path("/run/t/torchrun")) == expected


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (["--batch-size", "16"], ["--batch-size", "4"]),
        (["--batch-size=16"], ["--batch-size=4"]),
        (["--other", "1"], ["--other", "1", "--batch-size", "4"]),
    ],
)
def test_mapped_flag_replaced_or_appended(tail: list[str], expected: list[str]) -> None:
    mapping = {"train_micro_batch_size_per_gpu": "--batch-size"}
    assert script_command(["python", "t.py", *tail], ONE, 1, mapping) == [
        "python",
        "t.py",
        *expected,
    ]


def test_every_arg_key_takes_the_plan_value() -> None:
    mapping = parse_arg_map(["train_micro_batch_size_per_gpu=--mb",
                             "gradient_accumulation_steps=--ga", "train_batch_size=--gb"])  # fmt: skip
    out = script_command(["python", "t.py"], TWO, 1, mapping)
    assert out[-6:] == ["--mb", "4", "--ga", "2", "--gb", "16"]


@pytest.mark.parametrize(
    "item", ["micro=--batch-size", "train_micro_batch_size_per_gpu", "train_batch_size=batch"]
)
def test_bad_arg_map_is_refused_naming_the_item(item: str) -> None:
    with pytest.raises(AutotuneError, match=r"^--arg-map " + item.replace("[", r"\[")):
        parse_arg_map([item])


def test_check_command_refuses_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("", encoding="utf-8")
    check_command([sys.executable, str(script)], 2)
    with pytest.raises(AutotuneError, match=r"^--: .*missing\.py: no such script$"):
        check_command(["python", str(tmp_path / "missing.py")], 1)
    with pytest.raises(
        AutotuneError, match=r"^--nproc-per-node 2: the command launches 4 per node"
    ):
        check_command(["torchrun", "--nproc-per-node=4", str(script)], 2)
    with pytest.raises(AutotuneError, match=r"^--: make: not a launch command"):
        check_command(["make", "train"], 1)
    with pytest.raises(AutotuneError, match=r"^--: give the launch command"):
        check_command([], 1)


def test_the_spec_variable_is_the_one_the_hook_reads() -> None:
    from autotune.runtime.trial.script import HOOK_DIR, SPEC_ENV

    assert SCRIPT_SPEC_ENV == SPEC_ENV
    hook = (Path(HOOK_DIR) / "sitecustomize.py").read_text(encoding="utf-8")
    assert f'os.environ.get("{SPEC_ENV}")' in hook
