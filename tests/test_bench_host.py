"""The host-path scripts of benchmarks/ without a GPU, run briefly: torch_overhead.py's CPU rows (the real
device code, and with it stubbed by allocations, whose signature must follow the device layer's), step_host.py
--stand-in (convgen.torch's host path on the stand-in CuPy) and host_profile.py --split (convgen's own Python on
stand-ins). Their figures are only timed on the H200; here each path must run and report a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
TORCH_PATHS = ("custom op", "autograd.Function", "functional", "torch F.conv2d")


def run_script(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH_DIR / name), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_torch_overhead_times_every_path_on_the_cpu_real_and_stubbed() -> None:
    pytest.importorskip("torch")
    rows = json.loads(run_script("torch_overhead.py", "--calls", "20", "--repeats", "1", "--json"))
    timed = {(row["device"], row["path"]) for row in rows if row["forward_us"] > 0 and row["forward_backward_us"] > 0}
    assert {(device, path) for device in ("cpu", "cpu stub") for path in TORCH_PATHS} <= timed


def test_host_profile_split_times_the_max_pools_on_stand_ins(tmp_path) -> None:
    path = tmp_path / "host.json"
    run_script("host_profile.py", "--split", "--calls", "200", "--json", str(path))
    ops = json.loads(path.read_text())["host"]["ops"]
    assert len(ops) == 4 and all(op["us_per_call"] > 0 and op["calls_per_round"] == 200 for op in ops.values())


def test_step_host_stand_in_times_the_adapters_host_path_on_the_cpu() -> None:
    """step_host.py --stand-in runs convgen.torch's forward and step on CPU tensors through its CUDA runner on the
    stand-in CuPy, and leaves convgen.torch's device layer as it was."""
    pytest.importorskip("torch")
    out = run_script("step_host.py", "--stand-in", "--calls", "10", "--dtypes", "bfloat16")
    rows = [line.split() for line in out.splitlines() if line.endswith(" µs")]
    assert [" ".join(row[1:-2]) for row in rows] == [
        "convgen.torch forward (no grad)", "convgen.torch step", "trivial autograd.Function step"]
    assert all(row[0] == "bfloat16" and float(row[-2]) > 0 for row in rows)
    # The profile shows convgen.torch's own Python: with the compiled host path that is the functional ops' wrappers
    # (the forward and backward replay in C), without it the CUDA backend too.
    assert "runtime/torch/functional.py" in out


def test_the_stand_in_adapter_is_undone_after_its_block() -> None:
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BENCH_DIR))
    from convgen.torch import devices
    from suite.stand_in import stand_in_adapter

    runner, capability = devices._runner, torch.cuda.get_device_capability
    with stand_in_adapter(devices) as stand_in:
        assert devices._runner(torch.zeros(1)) is stand_in
    assert (devices._runner, torch.cuda.get_device_capability) == (runner, capability)
    assert devices._runner(torch.zeros(1)) is devices._CPU


def test_host_path_ab_stand_in_times_every_mode_and_leaves_the_backend_as_it_was(capsys) -> None:
    """host_path_ab.py --stand-in times each mode's backend Python (launch groups undone, an allocation a buffer,
    no launch programs) beside the backend as it is, and puts back what the modes replace."""
    sys.path.insert(0, str(BENCH_DIR))
    import convgen.cuda
    import host_path_ab
    from convgen import launch_program

    before = {name: getattr(convgen.cuda.CupyBackend, name) for name in ("_launch_group", "_scratch_base")}
    case = host_path_ab.CASES_BY_NAME["conv2d_64_56_n32"]
    host_path_ab.stand_in_ab([case], ["bfloat16"], "medium", 2)
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(case.title)]
    timed = dict(part.split(": ") for part in row.removeprefix(case.title).removeprefix(" bfloat16").split("  ")
                 if ": " in part)
    assert list(timed) == list(host_path_ab.STAND_IN_MODES) and all(float(us) > 0 for us in timed.values())
    assert (convgen.cuda.trace, convgen.cuda.replay) == (launch_program.trace, launch_program.replay)
    assert {name: getattr(convgen.cuda.CupyBackend, name) for name in before} == before


def test_step_stages_stand_in_marks_each_stage_of_a_step_in_order() -> None:
    """step_stages.py --stand-in times each stage of convgen.torch's forward and step on CPU tensors through the CUDA
    runner: the device layer, the scratch, each launch and output, autograd's node and our backward, in order."""
    pytest.importorskip("torch")
    out = run_script("step_stages.py", "--stand-in", "--calls", "3", "--dtypes", "bfloat16")
    blocks = out.split("== ")[1:]
    assert [block.splitlines()[0] for block in blocks] == [
        f"convgen.torch {call}, bfloat16 ({start}): µs from the start"
        for call in ("forward", "step") for start in ("from an idle CPU", "back to back")]
    step = [line.split() for line in blocks[3].splitlines()[1:]]
    assert [" ".join(row[:-2]) for row in step] == [
        "start", "devices.forward>", "scratch>", "scratch<", "launch forward_prep", "output>", "output<",
        "launch forward", "devices.forward<", "autograd node>", "autograd node<", "op returned", "our backward>",
        "devices.backward>", "scratch>", "scratch<", "launch backward_prep", "output>", "output<",
        "launch backward_input", "output>", "output<", "launch backward_weight", "output>", "output<",
        "launch backward_reduces", "devices.backward<", "our backward<", "backward returned", "end"]
    times = [float(row[-2]) for row in step]
    assert times == sorted(times) and times[-1] > 0 and {row[-1] for row in step} == {"main"}


def test_step_stages_puts_convgen_torch_back_after_its_block() -> None:
    pytest.importorskip("torch")
    sys.path.insert(0, str(BENCH_DIR))
    import step_stages
    from convgen.cuda import CupyBackend
    from convgen.torch import devices, functional

    def parts():
        return (devices.forward, devices.backward, functional._apply_eager, functional._Eager.backward,
                CupyBackend._call, devices._TorchCupyBackend._output, devices._TorchCupyBackend._scratch_base)

    before = parts()
    with step_stages.instrumented():
        assert all(a is not b for a, b in zip(parts(), before))
    assert parts() == before


def test_python_host_path_keeps_every_call_on_the_python_path_inside_its_block() -> None:
    """The instrumenting scripts (step_stages, launch_delay, launch_timeline, host_path_ab) mark or swap the Python
    path's methods: inside suite.host.python_host_path no call is replayed in C, after it calls are again."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BENCH_DIR))
    import convgen.torch as ct
    from convgen.torch import devices
    from convgen.torch import host_path as torch_paths
    from suite.host import python_host_path
    from suite.stand_in import stand_in_adapter

    if not torch_paths.COMPILED:
        pytest.skip("convgen._host_path is not built")
    forwards = []
    forward = devices.forward

    def counted(*args):
        forwards.append(args[0])
        return forward(*args)

    x = torch.randn(1, 2, 8)
    devices.forward = counted
    try:
        with stand_in_adapter(devices):
            with python_host_path():
                for _ in range(3):
                    ct.max_pool(x, 2)
            assert forwards == ["max_pool"] * 3 and not torch_paths.CALLS["max_pool"]
            for _ in range(3):
                ct.max_pool(x, 2)
    finally:
        devices.forward = forward
    assert forwards == ["max_pool"] * 4  # after the block: the first call's entry, then replays
