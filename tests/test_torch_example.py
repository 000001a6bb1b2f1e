"""examples/neighbourhood_consensus.py runs on the CPU, alone and under torchrun with two processes (gloo),
and its loss goes down."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "neighbourhood_consensus.py"
LOSS_LINE = re.compile(r"^step +(\d+) +loss ([0-9.]+) +match accuracy ([0-9.]+)", re.MULTILINE)


def run(command):
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return finished.stdout


def logged_losses(output, expected_steps):
    lines = LOSS_LINE.findall(output)
    assert [int(step) for step, _, _ in lines] == expected_steps, output
    assert "mean time per step:" in output
    return [float(loss) for _, loss, _ in lines]


def test_quick_run_on_the_cpu_lowers_the_loss():
    losses = logged_losses(run([sys.executable, str(EXAMPLE), "--quick"]), [5, 10, 15, 20, 25, 30])
    assert losses[-1] < losses[0]


def test_two_processes_under_torchrun_lower_the_loss():
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(EXAMPLE),
               "--quick", "--steps", "10"]
    output = run(command)
    assert output.startswith("2 process(es) on cpu"), output
    losses = logged_losses(output, [5, 10])
    assert losses[-1] < losses[0]


def test_arguments_that_leave_nothing_to_compare_are_refused():
    finished = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "5", "--log-every", "5"],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 2
    assert ("error: --log-every must be positive and below --steps (the first and last logging windows are "
            "compared), got --log-every 5 --steps 5") in finished.stderr
