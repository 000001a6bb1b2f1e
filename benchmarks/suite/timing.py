"""Timing behind one device protocol: the call as a user makes it (CUDA events around the Python call,
GPU idle and L2 flushed) and the kernels alone (replay of a CUDA graph, verified by poisoning its
outputs, or back-to-back calls / N where no graph can be captured)."""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# A graph replay must rewrite its NaN-poisoned outputs (a cell left poisoned gives an infinite error) to
# about the eager values: the bound only admits another summation order, which bf16 outputs round coarsely.
REPLAY_CHECK_REL_ERR = 2e-2
L2_FLUSH_BYTES = 256 << 20  # written before every user-call sample: several times the H200's L2


@dataclass(frozen=True)
class Settings:
    """How long to measure. A measurement takes `target_s / estimate` samples, clamped to
    [min_reps, max_reps]; if that would take over `cap_s`, fewer (never under floor_reps)."""

    warmup_calls: int
    min_reps: int
    max_reps: int
    target_s: float
    cap_s: float
    floor_reps: int
    kernel_rounds: int  # kernels alone: median over rounds of back-to-back launches
    round_target_s: float
    compile_child_timeout_s: int
    jax_child_timeout_s: int  # the JAX backward is known to abort; it must not hang the run either

    def reps_for(self, estimate_s: float) -> int:
        reps = min(max(round(self.target_s / max(estimate_s, 1e-7)), self.min_reps), self.max_reps)
        if reps * estimate_s > self.cap_s:
            reps = max(self.floor_reps, int(self.cap_s / max(estimate_s, 1e-7)))
        return reps


FULL = Settings(warmup_calls=5, min_reps=50, max_reps=200, target_s=0.4, cap_s=3.0, floor_reps=10,
                kernel_rounds=10, round_target_s=0.02, compile_child_timeout_s=180, jax_child_timeout_s=90)
QUICK = Settings(warmup_calls=2, min_reps=10, max_reps=30, target_s=0.05, cap_s=0.5, floor_reps=3,
                 kernel_rounds=3, round_target_s=0.01, compile_child_timeout_s=120, jax_child_timeout_s=60)


def relative_error(actual: Any, expected: Any) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64; inf for a shape mismatch or a non-finite value."""
    import numpy as np

    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if actual.size != expected.size:
        return math.inf
    diff = np.linalg.norm(actual.reshape(expected.shape) - expected)
    scale = np.linalg.norm(expected)
    error = float(diff / scale) if scale > 0 else float(diff)
    return error if math.isfinite(error) else math.inf


@dataclass
class Captured:
    """A captured CUDA graph of `len(kept)` calls; `kept` holds their results (the graph's buffers)."""

    replay: Callable[[], None]
    kept: list
    context: Callable[[], Any]  # makes the replay stream current, so that events land on it


class Device(Protocol):
    """What the timing needs of a library: a clock that waits for the device, graph capture, and
    (for the replay check) reading and poisoning an output array."""

    library: str

    def synchronize(self) -> None: ...

    def wait(self, result: Any) -> None: ...

    def start_timer(self) -> Any: ...

    def stop_timer(self, timer: Any, last_result: Any) -> float:
        """Milliseconds since `start_timer`, once `last_result` is ready."""
        ...

    def to_numpy(self, array: Any) -> Any: ...

    def poison(self, array: Any) -> None: ...

    def capture(self, call: Callable[[], Any], copies: int) -> Captured: ...


class CupyDevice:
    """CuPy's current stream, where convgen's tape launches."""

    library = "cupy"

    def __init__(self, cupy: Any):
        self.cupy = cupy

    def synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def wait(self, result: Any) -> None:
        self.synchronize()

    def start_timer(self) -> Any:
        start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        start.record()
        return start, end

    def stop_timer(self, timer: Any, last_result: Any) -> float:
        start, end = timer
        end.record()
        end.synchronize()
        return self.cupy.cuda.get_elapsed_time(start, end)

    def to_numpy(self, array: Any) -> Any:
        return self.cupy.asnumpy(array)

    def poison(self, array: Any) -> None:
        array.fill(math.nan)

    def capture(self, call: Callable[[], Any], copies: int) -> Captured:
        stream = self.cupy.cuda.Stream(non_blocking=True)
        with stream:
            call()  # once on this stream first: the memory pool keeps free blocks per stream
            stream.synchronize()
            stream.begin_capture()
            try:
                kept = [call() for _ in range(copies)]
            except BaseException:
                with contextlib.suppress(Exception):
                    stream.end_capture()
                raise
            graph = stream.end_capture()
        return Captured(replay=lambda: graph.launch(stream=stream), kept=kept, context=lambda: stream)

    def peak_memory(self, call: Callable[[], Any]) -> dict[str, int]:
        """Peak bytes the call holds in CuPy's pool at once (a memory hook), and the device-wide
        growth of used memory from an emptied pool (cudaMemGetInfo)."""
        cupy = self.cupy

        class PeakHook(cupy.cuda.MemoryHook):
            name = "convgen_bench_peak"

            def __init__(self) -> None:
                self.current = self.peak = 0

            def malloc_postprocess(self, **kw: Any) -> None:
                if kw.get("mem_ptr"):
                    self.current += kw["mem_size"]
                    self.peak = max(self.peak, self.current)

            def free_postprocess(self, **kw: Any) -> None:
                self.current -= kw["mem_size"]

        self.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        free_before = cupy.cuda.runtime.memGetInfo()[0]
        with PeakHook() as hook:
            result = call()
            self.synchronize()
        free_after = cupy.cuda.runtime.memGetInfo()[0]
        del result
        return {"peak_bytes": hook.peak, "device_growth_bytes": free_before - free_after}


class TorchDevice:
    """PyTorch's current stream."""

    library = "torch"

    def __init__(self, torch: Any):
        self.torch = torch

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def wait(self, result: Any) -> None:
        self.synchronize()

    def start_timer(self) -> Any:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        return start, end

    def stop_timer(self, timer: Any, last_result: Any) -> float:
        start, end = timer
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def to_numpy(self, array: Any) -> Any:
        value = array.detach().cpu()
        return (value.float() if value.dtype == self.torch.bfloat16 else value).numpy()  # NumPy has no bfloat16

    def poison(self, array: Any) -> None:
        array.detach().fill_(math.nan)

    def capture(self, call: Callable[[], Any], copies: int) -> Captured:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's docs ask
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kept = [call() for _ in range(copies)]
        return Captured(replay=graph.replay, kept=kept, context=contextlib.nullcontext)

    def peak_memory(self, call: Callable[[], Any]) -> dict[str, int]:
        torch = self.torch
        self.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        free_before = torch.cuda.mem_get_info()[0]
        result = call()
        self.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        free_after = torch.cuda.mem_get_info()[0]
        del result
        return {"peak_bytes": peak, "device_growth_bytes": free_before - free_after}


class JaxDevice:
    """JAX (child processes only): host clock around calls that block until their result is ready."""

    library = "jax"

    def __init__(self, jax: Any):
        self.jax = jax

    def synchronize(self) -> None:
        pass  # every timed call blocks on its own result

    def wait(self, result: Any) -> None:
        self.jax.block_until_ready(result)

    def start_timer(self) -> Any:
        return time.perf_counter()

    def stop_timer(self, timer: Any, last_result: Any) -> float:
        self.wait(last_result)
        return 1e3 * (time.perf_counter() - timer)

    def to_numpy(self, array: Any) -> Any:
        import numpy as np

        return np.asarray(array)

    def poison(self, array: Any) -> None:
        raise NotImplementedError("JAX arrays are immutable; there is no graph replay to check")

    def capture(self, call: Callable[[], Any], copies: int) -> Captured:
        raise NotImplementedError("JAX dispatches asynchronously; no graph capture here")


USER_CALL_METHOD = "events around the Python call (GPU idle, L2 flushed)"


@dataclass(frozen=True)
class UserCall:
    """One call to time as a user makes it: `key` names it in the answer, `active` is the context it runs under
    (a contestant's flags), entered around each sample."""

    key: Any
    device: Device
    call: Callable[[], Any]
    active: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


def turn_order(items: list[Any], turn: int) -> list[Any]:
    """`items` in the order of round `turn` of taking turns: a shuffle of their own, seeded by the round's number (a
    run repeats), so that each call follows each other one about as often. The one that follows PyTorch's calls pays
    for them: on an H100 host the tape's conv4d forward took 105 µs of host time right after PyTorch's conv3d loop
    and 68 µs after another tape's call on the same kernels (benchmarks/measured/2026-12-05-h100-s38-probe.txt), and
    a fixed order, or one turned by a place each round, put the same call there every time."""
    order = list(items)
    random.Random(turn).shuffle(order)
    return order


def time_user_calls_in_turn(calls: list[UserCall], settings: Settings, flush_l2: Callable[[], None],
                            failed: Callable[[Any, BaseException], None]) -> dict[Any, dict[str, Any]]:
    """The calls as a user makes them: GPU idle and L2 flushed, events around the Python call. After each one's
    warm-up the calls take turns sample by sample, so that a drift of the host's speed in the meantime reaches
    them alike (the H200's hosts move host-bound calls by tens of percent within minutes); each takes the samples
    its own time allows (`settings.reps_for`). Each round takes them in an order of its own (turn_order). A call that
    raises is reported to `failed` and left out."""
    reps: dict[Any, int] = {}
    for entry in calls:
        try:
            with entry.active():
                reps[entry.key] = settings.reps_for(_warm_up(entry, settings))
        except Exception as error:
            failed(entry.key, error)
    samples: dict[Any, list[float]] = {key: [] for key in reps}
    pending = [entry for entry in calls if entry.key in reps]
    turn = 0
    while pending:
        order, turn = turn_order(pending, turn), turn + 1
        for entry in order:
            try:
                with entry.active():
                    flush_l2()
                    entry.device.synchronize()
                    timer = entry.device.start_timer()
                    result = entry.call()
                    samples[entry.key].append(entry.device.stop_timer(timer, result))
                    del result
            except Exception as error:
                failed(entry.key, error)
                del samples[entry.key]
                pending.remove(entry)
                continue
            if len(samples[entry.key]) >= reps[entry.key]:
                pending.remove(entry)
    method = USER_CALL_METHOD if len(calls) == 1 else USER_CALL_METHOD[:-1] + "; the calls of a case taking turns)"
    return {key: summarize(values, method=method) for key, values in samples.items()}


def _warm_up(entry: UserCall, settings: Settings) -> float:
    """Warm-up calls (at most half the cap's time); the fastest one's seconds, to size the samples by."""
    warm: list[float] = []
    for _ in range(settings.warmup_calls):
        entry.device.synchronize()
        started = time.perf_counter()
        entry.device.wait(entry.call())
        warm.append(time.perf_counter() - started)
        if sum(warm) > settings.cap_s / 2:
            break
    return min(warm)


def time_user_calls(device: Device, call: Callable[[], Any], settings: Settings,
                    flush_l2: Callable[[], None]) -> dict[str, Any]:
    """One call as a user makes it (time_user_calls_in_turn alone); raises what the call raises."""
    errors: list[BaseException] = []
    timed = time_user_calls_in_turn([UserCall(None, device, call)], settings, flush_l2,
                                    lambda _, error: errors.append(error))
    if errors:
        raise errors[0]
    return timed[None]


def verify_replay(device: Device, captured: Captured, arrays_of: Callable[[Any], dict[str, Any]],
                  expected: dict[str, Any]) -> str:
    """Poison the first captured call's outputs, replay, and compare with the eager values: a graph
    that did not capture the work (launches on another stream) leaves the poison there."""
    arrays = arrays_of(captured.kept[0])
    for array in arrays.values():
        device.poison(array)
    poisoned = all(math.isnan(float(device.to_numpy(array.reshape(-1)[:1])[0]))
                   for array in arrays_of(captured.kept[0]).values())
    with captured.context():
        captured.replay()
    device.synchronize()
    for name, array in arrays_of(captured.kept[0]).items():
        error = relative_error(device.to_numpy(array), expected[name])
        if not error <= REPLAY_CHECK_REL_ERR:
            raise RuntimeError(f"graph replay did not recompute {name} (rel err {error:.2g} against the eager call)")
    return "verified" if poisoned else "outputs not writable, replay unverified"


def time_kernels(device: Device, call: Callable[[], Any], settings: Settings, copies: int,
                 arrays_of: Callable[[Any], dict[str, Any]], expected: dict[str, Any]) -> dict[str, Any]:
    """The kernels alone: replays of a CUDA graph holding `copies` calls, or, where capture fails,
    N back-to-back calls / N (then host overhead counts wherever it exceeds the GPU time)."""
    captured = None
    try:
        captured = device.capture(call, copies)
        check = verify_replay(device, captured, arrays_of, expected)
        launch, calls_per_launch, context = captured.replay, copies, captured.context
        method = f"CUDA graph replay, {copies} call(s) per graph, {check}"
    except Exception as error:
        captured = None
        device.synchronize()
        launch, calls_per_launch, context = call, 1, contextlib.nullcontext
        method = f"back-to-back calls / N (no graph: {one_line(error)})"
    with context():
        launch()
        device.synchronize()
        timer = device.start_timer()
        last = launch()
        estimate_s = device.stop_timer(timer, last) / 1e3
        launches = min(max(round(settings.round_target_s / max(estimate_s, 1e-7)), 1), 1000)
        rounds = settings.kernel_rounds if estimate_s * launches * settings.kernel_rounds < settings.cap_s else 3
        samples = []
        for _ in range(rounds):
            device.synchronize()
            timer = device.start_timer()
            for _ in range(launches):
                last = launch()
            samples.append(device.stop_timer(timer, last) / (launches * calls_per_launch))
    del captured
    device.synchronize()
    return summarize(samples, method=method) | {"calls_per_round": launches * calls_per_launch}


def summarize(samples_ms: list[float], method: str) -> dict[str, Any]:
    ordered = sorted(samples_ms)
    return {"median_ms": statistics.median(ordered), "min_ms": ordered[0],
            "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "samples": len(ordered),
            "method": method}


def one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
