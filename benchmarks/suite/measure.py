"""One case: check every contestant (the tape in each precision, convgen.torch, the PyTorch variants) against
the float64 PyTorch reference, then time it (user call and kernels, forward and forward+backward) and measure
its peak memory; JAX for the 4-D case."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from suite.cases import Case
from suite.cells import fmt_pair
from suite.children import run_jax_children
from suite.contestants import (
    ADAPTER,
    ADAPTER_LABELS,
    MODES,
    TORCH_BF16_CHANNELS_LAST,
    TORCH_REFERENCE,
    TORCH_STRICT,
    TORCH_TF32,
    AdapterContestant,
    Contestant,
    ConvgenContestant,
    Libraries,
    TorchContestant,
    TorchVariant,
    make_device_inputs,
)
from suite.precision import TAPE_PRECISIONS, case_precisions, convgen_label
from suite.report import MISMATCH_REL_ERR, CaseReport
from suite.timing import Settings, UserCall, relative_error, time_kernels, time_user_calls_in_turn


def run_case(case: Case, libs: Libraries, settings: Settings,
             precisions: tuple[str, ...] = TAPE_PRECISIONS) -> CaseReport:
    report = CaseReport(case)
    started = time.perf_counter()
    try:
        inputs = make_device_inputs(case, libs.cupy)
        reference_contestant = TorchContestant(case, inputs, libs.torch, TORCH_REFERENCE)
    except Exception as error:
        report.error("inputs/reference", error)
        return report
    with reference_contestant.active():
        by_mode = eager_outputs(reference_contestant, "float64 reference", report)
    reference = {name: array for outputs in by_mode.values() for name, array in outputs.items()}
    del reference_contestant, by_mode
    contestants = []  # kept until their calls are timed, which they take in turn
    for label, build in contestant_builders(case, inputs, libs, precisions):
        try:
            contestants.append(build())
        except Exception as error:
            report.error(f"{label} setup", error)
            continue
        check_and_time_kernels(contestants[-1], case, reference, settings, report)
    time_calls(contestants, settings, libs, report)
    for contestant in contestants:
        print_times(contestant.label, report)
    del contestants
    release_memory(libs)
    if case.rank == 4 and not case.is_batched:  # JAX's children take minutes; the unbatched case compares them
        report.jax = run_jax_children(case, inputs, reference, settings, libs.cupy.asnumpy)
    report.seconds = time.perf_counter() - started
    return report


def contestant_builders(case: Case, inputs: dict[str, Any], libs: Libraries,
                        precisions: tuple[str, ...]) -> list[tuple[str, Callable[[], Contestant]]]:
    """Each contestant's label and constructor, in the order they run: the tape in every precision the case
    takes, the adapter where it imports (on a batched convolution in bfloat16 and float16 too), the PyTorch
    variants."""
    builders: list[tuple[str, Callable[[], Contestant]]] = [
        (convgen_label(precision), partial(ConvgenContestant, case, inputs, libs.convgen, libs.cupy, precision))
        for precision in case_precisions(case, precisions)]
    if libs.adapter is not None:  # else skipped, as the run's first lines and the summary say
        builders.append((ADAPTER, partial(AdapterContestant, case, inputs, libs.torch, libs.adapter)))
        if case.is_batched and case.is_conv:  # where torch_bf16_cl runs: convgen's answer to it, fp16 too (issue 11)
            for dtype in ("bfloat16", "float16"):
                builders.append((ADAPTER_LABELS[dtype], partial(AdapterContestant, case, inputs, libs.torch,
                                                                libs.adapter, dtype)))
    builders += [(variant.label, partial(TorchContestant, case, inputs, libs.torch, variant))
                 for variant in torch_variants(case)]
    return builders


def torch_variants(case: Case) -> list[TorchVariant]:
    """Strict fp32 always; TF32 for convolutions (it changes nothing for the pools: no cuDNN
    convolution, no matmul); bf16 channels-last for the batched cases, the tensor-core baseline."""
    variants = [TORCH_STRICT]
    if case.is_conv:
        variants.append(TORCH_TF32)
    if case.is_batched:
        variants.append(TORCH_BF16_CHANNELS_LAST)
    return variants


def eager_outputs(contestant: Contestant, label: str, report: CaseReport) -> dict[str, dict[str, Any]]:
    """One eager call per mode: {mode: {output name: NumPy array}}; a failing mode is reported and left out."""
    outputs = {}
    for mode in MODES:
        try:
            result = contestant.call_for(mode)()
            arrays = contestant.arrays_of(result, mode)
            outputs[mode] = {name: contestant.device.to_numpy(array) for name, array in arrays.items()}
            del result, arrays
        except Exception as error:
            report.error(f"{label} {mode} (first call)", error)
    return outputs


def measure_contestant(contestant: Contestant, case: Case, reference: dict[str, Any], settings: Settings,
                       libs: Libraries, report: CaseReport) -> None:
    """One contestant alone: its check, kernels, memory and calls (run_case times a case's calls in turn)."""
    check_and_time_kernels(contestant, case, reference, settings, report)
    time_calls([contestant], settings, libs, report)
    print_times(contestant.label, report)


def check_and_time_kernels(contestant: Contestant, case: Case, reference: dict[str, Any], settings: Settings,
                           report: CaseReport) -> None:
    """The contestant's outputs against the reference, its kernels' times and its peak memory, per mode."""
    label, device = contestant.label, contestant.device
    with contestant.active() as flags:
        if flags:
            report.flags[label] = flags
        eager = eager_outputs(contestant, label, report)
        report.check[label] = {name: relative_error(value, reference[name])
                               for outputs in eager.values() for name, value in outputs.items() if name in reference}
        for mode in eager:
            call = contestant.call_for(mode)
            timings = report.timings.setdefault(label, {}).setdefault(mode, {})
            try:
                timings["kernels"] = time_kernels(device, call, settings, case.graph_copies,
                                                  lambda result, m=mode: contestant.arrays_of(result, m), eager[mode])
            except Exception as error:
                report.error(f"{label} {mode} kernel timing", error)
            try:
                report.memory.setdefault(label, {})[mode] = device.peak_memory(call)
            except Exception as error:
                report.error(f"{label} {mode} memory", error)


def time_calls(contestants: list[Contestant], settings: Settings, libs: Libraries, report: CaseReport) -> None:
    """The user calls of every mode each contestant ran eagerly, taking turns sample by sample."""
    calls = [UserCall((contestant.label, mode), contestant.device, contestant.call_for(mode), contestant.active)
             for contestant in contestants for mode in report.timings.get(contestant.label, {})]

    def failed(key: tuple[str, str], error: BaseException) -> None:
        report.error(f"{key[0]} {key[1]} call timing", error)

    for (label, mode), timing in time_user_calls_in_turn(calls, settings, libs.flush_l2, failed).items():
        report.timings[label][mode]["call"] = timing


def print_times(label: str, report: CaseReport) -> None:
    worst = report.worst_error(label)
    verdict = "-" if worst is None else f"{worst:.1e}" + ("" if worst <= MISMATCH_REL_ERR else " MISMATCH")
    times = "  ".join(f"{mode} {fmt_pair(report.median(label, mode, 'call'), report.median(label, mode, 'kernels'))}"
                      for mode in MODES)
    print(f"    {label:<13} err {verdict:<18} {times} ms (call/kernels)", flush=True)


def release_memory(libs: Libraries) -> None:
    gc.collect()
    libs.cupy.cuda.Device().synchronize()
    libs.cupy.get_default_memory_pool().free_all_blocks()
    libs.torch.cuda.empty_cache()
