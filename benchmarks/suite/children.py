"""The child processes: first-call compile times (fresh CuPy kernel cache, then warm on disk) and JAX's
4-D convolution (its backward is known to abort the process on the GPU). Each child is bench.py run
again with the hidden `--child` option; it prints one result line that the parent reads back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from suite.cases import CASES_BY_NAME, Case
from suite.contestants import ConvgenContestant, make_device_inputs
from suite.timing import (
    FULL,
    L2_FLUSH_BYTES,
    QUICK,
    JaxDevice,
    Settings,
    one_line,
    relative_error,
    time_kernels,
    time_user_calls,
)

BENCH_SCRIPT = Path(__file__).resolve().parent.parent / "bench.py"
CHILD_RESULT_MARKER = "BENCH_CHILD_RESULT "


def run_child(args: list[str], env_updates: dict[str, str], timeout_s: int) -> dict[str, Any]:
    """Run this script as a child; return its result line, or how it ended."""
    env = {k: v for k, v in os.environ.items() if k != "CUPY_CACHE_IN_MEMORY"} | env_updates
    command = [sys.executable, str(BENCH_SCRIPT), *args]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as expired:
        return {"ok": False, "status": f"timed out after {timeout_s} s", "stderr_tail": tail(expired.stderr)}
    if done.returncode < 0:
        status = f"killed by {signal.Signals(-done.returncode).name} (exit {done.returncode})"
    else:
        status = f"exit {done.returncode}"
    outcome = {"ok": done.returncode == 0, "status": status}
    if done.returncode != 0:
        outcome["stderr_tail"] = tail(done.stderr)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(CHILD_RESULT_MARKER):
            return json.loads(line[len(CHILD_RESULT_MARKER):]) | outcome
    return outcome


def tail(text: Any, lines: int = 6, limit: int = 600) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    kept = " | ".join(line.strip() for line in (text or "").splitlines() if line.strip())
    kept = " | ".join(kept.split(" | ")[-lines:])
    return kept[-limit:]


def emit_child_result(result: dict[str, Any]) -> None:
    print(CHILD_RESULT_MARKER + json.dumps(result), flush=True)


def timed(call: Callable[[], Any], cupy: Any) -> tuple[Any, float]:
    """(result, host seconds until the device is done)."""
    started = time.perf_counter()
    result = call()
    cupy.cuda.Device().synchronize()
    return result, time.perf_counter() - started


def compile_child(case_names: list[str]) -> None:
    """First calls of every case in a fresh process (the kernel cache is the parent's choice)."""
    started = time.perf_counter()
    import convgen
    import cupy

    result: dict[str, Any] = {"import_s": time.perf_counter() - started, "cases": {}}
    started = time.perf_counter()
    cupy.cuda.Device(0).use()
    cupy.empty(1)  # creates the CUDA context, compiles nothing
    result["context_s"] = time.perf_counter() - started
    for name in case_names:
        case = CASES_BY_NAME[name]
        entry: dict[str, Any] = {}
        try:
            inputs = make_device_inputs(case, cupy)
            cupy.cuda.Device().synchronize()
            contestant, entry["tape_s"] = timed(partial(ConvgenContestant, case, inputs, convgen, cupy), cupy)
            forward_result, entry["first_forward_s"] = timed(contestant.forward, cupy)
            _, entry["first_backward_s"] = timed(partial(contestant.backward, forward_result), cupy)
            _, entry["second_forward_backward_s"] = timed(contestant.forward_backward, cupy)
        except Exception as error:
            entry["error"] = one_line(error)
        result["cases"][name] = entry
    cache_dir = os.environ.get("CUPY_CACHE_DIR")
    result["cache_files"] = sum(len(files) for _, _, files in os.walk(cache_dir)) if cache_dir else None
    emit_child_result(result)


def measure_compile_times(cases: list[Case], cache_dir: str, settings: Settings) -> dict[str, Any]:
    """Cold: a child with an empty CuPy kernel cache dir; warm: a second child, same dir."""
    names = ",".join(case.name for case in cases)
    env = {"CUPY_CACHE_DIR": cache_dir}
    runs = {}
    for label in ("cold", "warm"):
        print(f"  compile-time child ({label} kernel cache {cache_dir}) ...", flush=True)
        started = time.perf_counter()
        runs[label] = run_child(["--child", "compile", "--cases", names], env, settings.compile_child_timeout_s)
        runs[label]["wall_s"] = time.perf_counter() - started
        print(f"    {label}: {runs[label]['status']}, {runs[label]['wall_s']:.1f} s", flush=True)
    return runs


def jax_child(mode: str, work_dir: str, quick: bool) -> None:
    """JAX's conv_general_dilated on the conv4d case: forward timings, or the backward attempt."""
    import numpy as np

    settings = QUICK if quick else FULL
    work = Path(work_dir)
    geometry = json.loads((work / "geometry.json").read_text())
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    result: dict[str, Any] = {"jax_version": jax.__version__, "device": str(device), "platform": device.platform}
    emit_child_result(result | {"stage": "started"})  # a later abort still leaves the versions
    arrays = {name: jax.device_put(np.load(work / f"{name}.npy")) for name in ("x", "weight", "bias", "seed")}
    rank = len(geometry["stride"])

    def conv(x: Any, weight: Any, bias: Any, precision: Any) -> Any:
        y = jax.lax.conv_general_dilated(x[None], weight, window_strides=geometry["stride"],
                                         padding=[(p, p) for p in geometry["padding"]], precision=precision)
        return y[0] + bias.reshape((-1,) + (1,) * rank)

    jax_device = JaxDevice(jax)
    flush_buffer = jnp.zeros(L2_FLUSH_BYTES // 4, jnp.float32)
    flush_kernel = jax.jit(lambda a: a + 1.0)

    def flush_l2() -> None:
        flush_kernel(flush_buffer).block_until_ready()

    precisions = {"highest": jax.lax.Precision.HIGHEST, "default": jax.lax.Precision.DEFAULT}
    x, weight, bias, seed = (arrays[n] for n in ("x", "weight", "bias", "seed"))
    for precision_name, precision in precisions.items():
        if mode == "forward":
            call = jax.jit(lambda x, w, b, p=precision: conv(x, w, b, p))
            run = lambda call=call: call(x, weight, bias)  # noqa: E731
            outputs = lambda value: {"y": value}  # noqa: E731
        else:
            def vjp(x: Any, w: Any, b: Any, s: Any, p: Any = precision) -> Any:
                _, pullback = jax.vjp(lambda x, w, b: conv(x, w, b, p), x, w, b)
                return pullback(s)

            call = jax.jit(vjp)
            run = lambda call=call: call(x, weight, bias, seed)  # noqa: E731
            outputs = lambda value: dict(zip(("grad_x", "grad_weight", "grad_bias"), value, strict=True))  # noqa: E731
        print(f"jax {mode} {precision_name}: compiling and running", flush=True)
        started = time.perf_counter()
        value = jax.block_until_ready(run())
        entry = {"first_call_s": time.perf_counter() - started}
        for name, array in outputs(value).items():
            np.save(work / f"{mode}_{precision_name}_{name}.npy", np.asarray(array))
        entry["call"] = time_user_calls(jax_device, run, settings, flush_l2)
        entry["kernels"] = time_kernels(jax_device, run, settings, 1, lambda _: {}, {})
        entry["kernels"]["method"] = "back-to-back calls / N (JAX: host clock, blocking on the last)"
        result[precision_name] = entry
    emit_child_result(result | {"stage": "done"})


def run_jax_children(case: Case, inputs: dict[str, Any], reference: dict[str, Any], settings: Settings,
                     to_numpy: Callable[[Any], Any]) -> dict[str, Any]:
    """JAX forward, then the backward attempt (known to abort the process), each in a child."""
    import numpy as np

    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="convgen-bench-jax-") as work_dir:
        work = Path(work_dir)
        for name, array in inputs.items():
            np.save(work / f"{name}.npy", to_numpy(array))
        (work / "geometry.json").write_text(json.dumps({"stride": case.strides, "padding": case.paddings}))
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_PLATFORMS": "cuda"}
        for mode in ("forward", "backward"):
            args = ["--child", f"jax-{mode}", "--work-dir", work_dir] + (["--quick"] if settings is QUICK else [])
            print(f"    jax {mode} child ...", flush=True)
            outcome = run_child(args, env, settings.jax_child_timeout_s)
            outcome["check_rel_err"] = {}
            for path in sorted(work.glob(f"{mode}_*.npy")):  # {mode}_{precision}_{output}.npy
                _, precision, output = path.stem.split("_", 2)
                outcome["check_rel_err"][f"{precision}:{output}"] = relative_error(np.load(path), reference[output])
            report[mode] = outcome
            print(f"    jax {mode}: {outcome['status']}"
                  + (f" ({outcome['stderr_tail'][-200:]})" if outcome.get("stderr_tail") and not outcome["ok"] else ""),
                  flush=True)
    return report
