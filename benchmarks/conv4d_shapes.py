#!/usr/bin/env python3
"""4-D convolutions as convgen's users run them, beyond the benchmark's one conv4d case: convgen.torch's `conv`
against the conv3d loop a PyTorch user writes today (suite/contestants.py, cuDNN tuned), forward and
forward+backward (the gradients of input, weight and bias), float32 in strict fp32 (TF32 off on both sides), at
PyTorch's defaults (cuDNN's convolutions in TF32, which convgen.torch follows) and under bf16 autocast (`--modes`),
float64 where asked.

The shapes come from the fields the README names: neighbourhood consensus over 4-D correlation volumes (one
channel in or out, few in between), light fields (two angular and two spatial axes), 3-D+time volumes and
lattice field theory (periodic boundaries, float64). Each figure is the median over rounds of back-to-back calls
between CUDA events (at these sizes the GPU sets the pace), ms a call; ratio = the loop's time / convgen's.

    python3 benchmarks/conv4d_shapes.py [--shapes NAME,...] [--modes strict,tf32,bf16] [--rounds 5] [--calls 10]
                                        [--list]
    python3 benchmarks/conv4d_shapes.py --stages [--precisions highest,high,medium] [--shapes NAME,...]

`--stages` times each stage (forward, input gradient, weight gradient, each with its packs and reduces) on the
CUDA tape's backend in each precision instead, µs a call (kernel_ab.py's timing), with the kernel the plan gives
it: `direct` (the small-channel direct kernel), `wgmma`, `mma` (the mma.sync pipeline) or `fma` (the GEMM with
FMAs), and the GEMM's tile and split. Circular shapes are timed zero-padded there (their wrap is a copy stage).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

from convgen.generated.contract import GEMM_STAGES
from suite.contestants import conv4d_by_conv3d


@dataclass(frozen=True)
class Shape:
    """A 4-D convolution of stride 1: input [batch, in_c, *extents], weight [out_c, in_c, k, k, k, k]."""

    name: str
    field: str
    batch: int
    in_c: int
    out_c: int
    extents: tuple[int, int, int, int]
    k: int
    padding_mode: str = "zeros"
    dtype: str = "float32"

    @property
    def padding(self) -> int:
        return self.k // 2


SHAPES = (
    Shape("nc_1to16", "neighbourhood consensus, first layer", 4, 1, 16, (20, 20, 20, 20), 3),
    Shape("nc_16to16", "neighbourhood consensus, middle layer", 4, 16, 16, (20, 20, 20, 20), 3),
    Shape("nc_16to1", "neighbourhood consensus, last layer", 4, 16, 1, (20, 20, 20, 20), 3),
    Shape("nc_k5_10to10", "neighbourhood consensus, k5", 2, 10, 10, (16, 16, 16, 16), 5),
    Shape("lf_32to32", "light field, 8x8 views of 32x32", 8, 32, 32, (8, 8, 32, 32), 3),
    Shape("lf_3to32", "light field, RGB in", 8, 3, 32, (8, 8, 32, 32), 3),
    Shape("med_16to16", "3-D+time volume, 8 frames of 32^3", 2, 16, 16, (8, 32, 32, 32), 3),
    Shape("bench_8to8", "the benchmark's conv4d", 8, 8, 8, (16, 16, 16, 16), 3),
    Shape("mid_24to24", "24 channels, 16^4", 8, 24, 24, (16, 16, 16, 16), 3),
    Shape("mid_32to32", "32 channels, 16^4", 8, 32, 32, (16, 16, 16, 16), 3),
    Shape("lattice_4to8", "lattice, periodic", 16, 4, 8, (16, 16, 16, 16), 3, "circular"),
    Shape("lattice_4to8_f64", "lattice, periodic, float64", 16, 4, 8, (16, 16, 16, 16), 3, "circular", "float64"),
)
SHAPES_BY_NAME = {shape.name: shape for shape in SHAPES}
# A float32 shape's modes: name -> (its label, TF32 allowed, the autocast dtype's name or None).
MODES = {"strict": ("strict", False, None), "tf32": ("TF32 (torch's default)", True, None),
         "bf16": ("bf16 (autocast)", True, "bfloat16")}


def loop_conv(x: Any, weight: Any, bias: Any, shape: Shape) -> Any:
    """The conv3d loop, the circular wrap made as a PyTorch user makes it (F.pad's circular mode stops at three
    axes): each axis's last `padding` cells put before it and its first after it, then no padding."""
    import torch

    if shape.padding_mode == "circular":
        p = shape.padding
        for axis in range(2, 6):
            x = torch.cat((x.narrow(axis, x.shape[axis] - p, p), x, x.narrow(axis, 0, p)), axis)
        return conv4d_by_conv3d(x, weight, bias, (1,) * 4, (0,) * 4)
    return conv4d_by_conv3d(x, weight, bias, (1,) * 4, (shape.padding,) * 4)


def time_ms(torch: Any, call: Any, rounds: int, calls: int) -> float:
    """Median over `rounds` of the mean of `calls` back-to-back calls between CUDA events, ms."""
    call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / calls)
    return statistics.median(samples)


def run_shape(torch: Any, adapter: Any, shape: Shape, tf32: bool, rounds: int, calls: int,
              autocast: str | None = None) -> dict[str, float]:
    """convgen.torch and the loop, forward and forward+backward, with TF32 allowed or not, under autocast to the
    dtype named `autocast` where given; the relative error of convgen's output against the loop's."""
    dtype = getattr(torch, shape.dtype)
    generator = torch.Generator(device="cuda").manual_seed(20261206)

    def normal(*size: int) -> Any:
        return torch.randn(*size, device="cuda", dtype=dtype, generator=generator)

    x = normal(shape.batch, shape.in_c, *shape.extents).requires_grad_(True)
    weight = (normal(shape.out_c, shape.in_c, *(shape.k,) * 4) / (shape.in_c * shape.k**4) ** 0.5).requires_grad_(True)
    bias = normal(shape.out_c).requires_grad_(True)
    torch.backends.cudnn.allow_tf32 = tf32
    adapter.set_float32_precision(None)  # follow torch's switch, as a user's convgen.torch does
    cast = torch.autocast("cuda", dtype=getattr(torch, autocast or "bfloat16"), enabled=autocast is not None)

    def ours() -> Any:
        with cast:
            return adapter.conv(x, weight, bias, padding=shape.padding, padding_mode=shape.padding_mode)

    def theirs() -> Any:
        with cast:
            return loop_conv(x, weight, bias, shape)

    probe = ours()
    upstream = normal(*probe.shape).to(probe.dtype)
    inputs = (x, weight, bias)
    row = {}
    for side, call in (("convgen", ours), ("loop", theirs)):
        row[f"{side}_fwd"] = time_ms(torch, lambda c=call: c().detach(), rounds, calls)
        row[f"{side}_fwd_bwd"] = time_ms(torch, lambda c=call: torch.autograd.grad(c(), inputs, upstream),
                                         rounds, calls)
    with torch.no_grad():
        reference = theirs().double()  # the loop's, in the same mode
        row["rel_err"] = float((ours().double() - reference).norm() / reference.norm())
    return row


def stage_kernel(defines: dict[str, int], stage: str) -> str:
    """What the plan runs `stage` on, from its defines."""
    p = GEMM_STAGES[stage]
    if defines.get(f"{p}_DIRECT"):
        form = "direct mma" if defines[f"{p}_DIRECT_MMA"] else "direct"
        if stage == "backward_weight":
            return f"{form} V{defines[f'{p}_DIRECT_V']} blocks {defines[f'{p}_DIRECT_CHANNEL_BLOCKS']}x" \
                   f"{defines[f'{p}_SPLIT']}"
        slices = defines[f"{p}_DIRECT_SLICES"]
        sliced = f" slices {slices}" if slices > 1 else ""
        return f"{form} V{defines[f'{p}_DIRECT_V']} CB{defines[f'{p}_DIRECT_CB']}{sliced}"
    if defines.get(f"{p}_WGMMA"):
        return f"wgmma N{defines[f'{p}_WG_N']} split {defines[f'{p}_SPLIT']}"
    kind = "mma" if defines[f"{p}_MMA"] else "fma"
    return f"{kind} {defines[f'{p}_BM']}x{defines[f'{p}_BN']} split {defines[f'{p}_SPLIT']}"


def time_stages(shapes: list[Shape], precisions: list[str], rounds: int) -> None:
    """Each stage of each shape in each precision on the CUDA tape's backend: its kernel and µs a call."""
    import cupy
    from convgen.cuda import CupyBackend
    from convgen.generated.contract import Family
    from convgen.geometry import Geometry
    from kernel_ab import STAGES, stage_calls
    from suite.contestants import random_inputs
    from tile_sweep import median_us

    print(f"# {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}; µs a call, median of {rounds} rounds")
    print("| shape | precision | " + " | ".join(STAGES) + " |")
    print("|---|---|" + "---|" * len(STAGES))
    for shape in shapes:
        geom = Geometry.build(Family.CONV, shape.in_c, shape.out_c, shape.extents, (shape.k,) * 4, (1,) * 4,
                              (shape.padding,) * 4, None, batch=shape.batch)
        for precision in precisions if shape.dtype == "float32" else ("highest",):
            backend = CupyBackend(shape.dtype, precision)
            inputs, grad = random_inputs(cupy, geom, shape.dtype, seed=7)
            calls = stage_calls(backend, geom, inputs, grad)
            defines = backend._compile(geom).plan.defines
            cells = []
            for stage in STAGES:
                calls[stage]()
                cells.append(f"{median_us(calls[stage], rounds, cupy):.1f} ({stage_kernel(defines, stage)})")
            print(f"| {shape.name} | {precision} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES_BY_NAME), help="comma-separated names (default: all)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10, help="back-to-back calls a round")
    parser.add_argument("--modes", default=",".join(MODES), help=f"float32 shapes' modes, of {', '.join(MODES)}")
    parser.add_argument("--list", action="store_true", help="print the shapes and exit (no GPU needed)")
    parser.add_argument("--stages", action="store_true", help="time each stage on the tape's backend instead")
    parser.add_argument("--precisions", default="highest,high,medium", help="with --stages: comma-separated")
    args = parser.parse_args()
    shapes = [SHAPES_BY_NAME[name] for name in args.shapes.split(",")]
    modes = [MODES[name] for name in args.modes.split(",")]
    if args.list:
        for shape in shapes:
            print(f"{shape.name:<18} {shape}")
        return
    if args.stages:
        time_stages(shapes, args.precisions.split(","), args.rounds)
        return
    import convgen.torch as adapter
    import torch

    torch.backends.cudnn.benchmark = True  # the loop tuned, as a tuned training loop runs it
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          "ms a call (fwd / fwd+bwd), ratio = loop / convgen")
    print("| shape | field | mode | convgen | conv3d loop | ratio fwd / fwd+bwd | rel err |")
    print("|---|---|---|---|---|---|---|")
    for shape in shapes:
        for mode, tf32, autocast in modes if shape.dtype == "float32" else ((shape.dtype, False, None),):
            row = run_shape(torch, adapter, shape, tf32, args.rounds, args.calls, autocast)
            print(f"| {shape.name} N{shape.batch} {shape.in_c}→{shape.out_c} {'×'.join(map(str, shape.extents))} "
                  f"k{shape.k} | {shape.field} | {mode} | {row['convgen_fwd']:.3f} / {row['convgen_fwd_bwd']:.3f} | "
                  f"{row['loop_fwd']:.3f} / {row['loop_fwd_bwd']:.3f} | "
                  f"{row['loop_fwd'] / row['convgen_fwd']:.2f} / {row['loop_fwd_bwd'] / row['convgen_fwd_bwd']:.2f} | "
                  f"{row['rel_err']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
