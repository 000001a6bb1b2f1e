#!/usr/bin/env python3
"""Time one stage (`--stage`: the forward, the backward_input or the backward_weight) of small-channel conv cases
under the small-channel direct kernels' tiles and under the implicit GEMM: the plans' pick first, then the GEMM (no
direct kernel), then each `--tile` (V cells a thread, block threads; the box and channels a step cut as the plans
cut them, or CB channels a step in opted-in shared memory; none for the weight gradient), and in the precision
"medium" (`--precision`) each `--mma-tile` (the direct kernel on TF32 tensor cores). Back-to-back forwards,
or backwards of one recorded forward (whose other stages are the same kernels in every row), on the CUDA tape,
CUDA events, median of rounds: at these sizes the GPU, not the host, sets the pace. With `--dtype` float16 or
bfloat16 each row times the stage alone (kernel_ab's stage calls) on a 16-bit CUDA backend, as convgen.torch runs
16-bit tensors. Every row's output (y, or the input's or weight's gradient) is compared with the first's. The
weight gradient gets a row of its direct kernel wherever the kernel can take it. Feeds docs/DESIGN.md's rule for
when the plans take the direct kernels.

    python benchmarks/direct_sweep.py [--stage forward|backward_input|backward_weight] [--cases NAME,...]
                                      [--tile V,THREADS[,CB]]... [--precision P] [--mma-tile TILES,CELLS]...
                                      [--mma-box AxBx...[,SLICES]]... [--dtype float32|float16|bfloat16]
                                      [--rounds N] [--list]

The cases are the benchmark's (suite/cases.py) whose stage has at most MMA_DIRECT_MAX_M (32) dst channels, and
EXTRA_CASES below. `--list` prints each row's tile without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

from convgen.backend import HALF_DTYPES
from convgen.direct_model import (
    MMA_DIRECT_MAX_M,
    DirectTile,
    choose_direct,
    cut_tile,
    direct_shared_bytes,
    direct_tile,
    mma_slices,
    mma_tile,
)
from convgen.direct_shapes import MMA_DIRECT_MODE, DirectShape, direct_shapes, mma_box, weight_shape
from convgen.direct_weight_model import MMA_WEIGHT_MAX_WARPS, WeightTile, weight_mma_tile
from convgen.tile_model import H200, Hardware
from suite.cases import CASES, Case, batched_conv
from suite.contestants import convgen_op, make_device_inputs, random_inputs

# Small-channel shapes beyond the benchmark's (no cuDNN reference times: 0).
EXTRA_CASES = (
    batched_conv("conv3d_8_32_n8", "conv3d N8 8→8 32³ k3 p1", 8, 8, 8, (32, 32, 32), 3, 1, 1, 0, 0),
    batched_conv("conv3d_16_16_n16", "conv3d N16 16→16 16³ k3 p1", 16, 16, 16, (16, 16, 16), 3, 1, 1, 0, 0),
    batched_conv("conv4d_8_8_n32", "conv4d N32 8→8 8⁴ k3 p1", 32, 8, 8, (8, 8, 8, 8), 3, 1, 1, 0, 0),
    batched_conv("conv2d_16_56_n32", "conv2d N32 16→16 56² k3 p1", 32, 16, 16, (56, 56), 3, 1, 1, 0, 0),
    batched_conv("conv2d_64_8_n32", "conv2d N32 64→8 56² k3 p1", 32, 64, 8, (56, 56), 3, 1, 1, 0, 0),
    batched_conv("conv2d_8_64_n32", "conv2d N32 8→64 56² k3 p1", 32, 8, 64, (56, 56), 3, 1, 1, 0, 0),
    batched_conv("conv2d_3_64_k4s2_n32", "conv2d N32 3→64 112² k4 s2 p1", 32, 3, 64, (112, 112), 4, 2, 1, 0, 0),
    batched_conv("conv3d_4_32_s2_n8", "conv3d N8 4→32 32³ k3 s2 p1", 8, 4, 32, (32, 32, 32), 3, 2, 1, 0, 0),
    # 4-D shapes of conv4d_shapes.py: neighbourhood consensus layers, a 3-D+time volume
    batched_conv("conv4d_16_20_n4", "conv4d N4 16→16 20⁴ k3 p1", 4, 16, 16, (20,) * 4, 3, 1, 1, 0, 0),
    batched_conv("conv4d_16to1_20_n4", "conv4d N4 16→1 20⁴ k3 p1", 4, 16, 1, (20,) * 4, 3, 1, 1, 0, 0),
    batched_conv("conv4d_1to16_20_n4", "conv4d N4 1→16 20⁴ k3 p1", 4, 1, 16, (20,) * 4, 3, 1, 1, 0, 0),
    batched_conv("conv4d_10_16_k5_n2", "conv4d N2 10→10 16⁴ k5 p2", 2, 10, 10, (16,) * 4, 5, 1, 2, 0, 0),
    batched_conv("conv4d_16_8x32_n2", "conv4d N2 16→16 8×32³ k3 p1", 2, 16, 16, (8, 32, 32, 32), 3, 1, 1, 0, 0),
    # 24 and 32 channels, where the TF32 conv stages take wgmma: conv4d_shapes.py's light field and 16⁴ layers
    batched_conv("conv4d_24_16_n8", "conv4d N8 24→24 16⁴ k3 p1", 8, 24, 24, (16,) * 4, 3, 1, 1, 0, 0),
    batched_conv("conv4d_32_16_n8", "conv4d N8 32→32 16⁴ k3 p1", 8, 32, 32, (16,) * 4, 3, 1, 1, 0, 0),
    batched_conv("conv4d_32_lf_n8", "conv4d N8 32→32 8×8×32² k3 p1", 8, 32, 32, (8, 8, 32, 32), 3, 1, 1, 0, 0),
    # Rank 7 with a 2^7 window (128 offsets) at 16-32 channels, where the plans took the weight gradient's tensor-core
    # tile as at rank 4's 3^4 (the larger windows of k3 past rank 4 are beyond the tile)
    batched_conv("conv7d_16_6_k2_n4", "conv7d N4 16→16 6⁷ k2", 4, 16, 16, (6,) * 7, 2, 1, 0, 0, 0),
    batched_conv("conv7d_24_6_k2_n2", "conv7d N2 24→24 6⁷ k2", 2, 24, 24, (6,) * 7, 2, 1, 0, 0, 0),
    batched_conv("conv7d_32_6_k2_n2", "conv7d N2 32→32 6⁷ k2", 2, 32, 32, (6,) * 7, 2, 1, 0, 0, 0),
    # Other ranks' windows of at least 81 offsets that the tile holds at 16 channels, and windows of 64
    batched_conv("conv2d_16_128_k9_n8", "conv2d N8 16→16 128² k9 p4", 8, 16, 16, (128, 128), 9, 1, 4, 0, 0),
    batched_conv("conv3d_16_32_k5_n4", "conv3d N4 16→16 32³ k5 p2", 4, 16, 16, (32,) * 3, 5, 1, 2, 0, 0),
    batched_conv("conv6d_16_8_k2_n4", "conv6d N4 16→16 8⁶ k2", 4, 16, 16, (8,) * 6, 2, 1, 0, 0, 0),
    batched_conv("conv2d_16_128_k8_n8", "conv2d N8 16→16 128² k8 p4", 8, 16, 16, (128, 128), 8, 1, 4, 0, 0),
    batched_conv("conv3d_16_32_k4_n4", "conv3d N4 16→16 32³ k4 p2", 4, 16, 16, (32,) * 3, 4, 1, 2, 0, 0),
    batched_conv("conv8d_16_5_k2_n2", "conv8d N2 16→16 5⁸ k2", 2, 16, 16, (5,) * 8, 2, 1, 0, 0, 0),
    # Extents that are not powers of two, where mma_box's boxes are partly empty: a 25⁴ correlation volume (NCNet's),
    # light fields of 9×9 views, a 12⁵ grid
    batched_conv("conv4d_16_25_n4", "conv4d N4 16→16 25⁴ k3 p1", 4, 16, 16, (25,) * 4, 3, 1, 1, 0, 0),
    batched_conv("conv4d_16_lf9_n8", "conv4d N8 16→16 9×9×32² k3 p1", 8, 16, 16, (9, 9, 32, 32), 3, 1, 1, 0, 0),
    batched_conv("conv5d_16_12_n4", "conv5d N4 16→16 12⁵ k3 p1", 4, 16, 16, (12,) * 5, 3, 1, 1, 0, 0),
    # ... and past 16 channels
    *(batched_conv(f"{name}_{c}", title.format(c=c), batch, c, c, spatial, k, 1, padding, 0, 0)
      for c in (24, 32) for name, title, batch, spatial, k, padding in (
          ("conv2d_128_k8_n8", "conv2d N8 {c}→{c} 128² k8 p4", 8, (128, 128), 8, 4),
          ("conv3d_32_k4_n4", "conv3d N4 {c}→{c} 32³ k4 p2", 4, (32,) * 3, 4, 2),
          ("conv6d_8_k2_n4", "conv6d N4 {c}→{c} 8⁶ k2", 4, (8,) * 6, 2, 0))),
)
STAGES = ("forward", "backward_input", "backward_weight")
ROUNDS, LAUNCHES_PER_ROUND = 7, 20
Chooser = Callable[[DirectShape, Hardware], "DirectTile | None"]


def parse_tile(text: str) -> tuple[int, ...]:
    """`V,THREADS` or `V,THREADS,CB` (argparse's type for --tile)."""
    parts = text.split(",")
    if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a tile is V,THREADS or V,THREADS,CB (positive integers), got {text!r}")
    return tuple(int(p) for p in parts)


def parse_mma_tile(text: str) -> tuple[int, ...]:
    """`TILES,CELLS`, `TILES,CELLS,SLICES` or (the weight gradient's) `TILES,CELLS,PARTS,MIN_BLOCKS` (argparse's type
    for --mma-tile)."""
    parts = text.split(",")
    least = [0 if i == 1 and len(parts) == 4 else 1 for i in range(len(parts))]  # the weight form's CELLS may be 0
    if len(parts) not in (2, 3, 4) or not all(p.isdigit() and int(p) >= low for p, low in zip(parts, least)):
        raise argparse.ArgumentTypeError(f"an mma tile is TILES,CELLS[,SLICES] or TILES,CELLS,PARTS,MIN_BLOCKS "
                                         f"(positive integers; the weight form's CELLS 0: the plans' box), "
                                         f"got {text!r}")
    return tuple(int(p) for p in parts)


def parse_mma_box(text: str) -> tuple[tuple[int, ...], int]:
    """`AxBx...` or `AxBx...,SLICES`: a box of cells per axis and the slices of the first axis's window offsets (0: the
    plans'; argparse's type for --mma-box)."""
    box, _, slices = text.partition(",")
    extents = box.split("x")
    if not all(e.isdigit() and int(e) > 0 for e in extents) or not (slices == "" or slices.isdigit()):
        raise argparse.ArgumentTypeError(f"an mma box is AxBx...[,SLICES] (positive integers), got {text!r}")
    return tuple(int(e) for e in extents), int(slices or 0)


def stage_shape(case: Case, stage: str, precision: str = "highest", dtype: str = "float32") -> DirectShape | None:
    """The case's `stage` as the direct kernels see it on `dtype` elements (staged as float32) in `precision`, if it
    is a convolution: a 16-bit weight gradient's shape says so (DirectShape.half) as the plans' does, since a row's
    choice applies only where the shapes are equal."""
    if not case.is_conv:
        return None
    mma = MMA_DIRECT_MODE if precision == "medium" else 0
    if stage == "backward_weight":
        return weight_shape(case.geometry, 4, mma, dtype in HALF_DTYPES)
    return direct_shapes(case.geometry, 4, mma)[stage]


def tile_of(shape: DirectShape, v: int, threads: int, cb: int | None = None, hardware: Hardware = H200
            ) -> DirectTile | None:
    """The direct tile of `v` cells a thread and `threads` threads, cut as the plans cut one, or with `cb` source
    channels a step in as much shared memory as a block may opt in to; None when the stage has more dst channels
    than the kernel holds or the step does not fit, and for the weight gradient (whose tile has no such choice)."""
    if not direct_tile(shape, hardware) or shape.weight:
        return None
    if cb is None:
        return cut_tile(shape, v, threads, hardware)
    tile = cut_tile(shape, v, threads, hardware, max_cb=cb, shared_bytes=hardware.shared_optin_per_block)
    return tile if tile is not None and tile.cb == min(cb, shape.source_c) else None


def rows(shape: DirectShape, tiles: list[tuple[int, ...]], mma_tiles: list[tuple[int, ...]] = (),
         mma_boxes: list[tuple[tuple[int, ...], int]] = ()) -> list[tuple[str, Chooser]]:
    """(label, direct chooser) of every row of a case: the plans' pick, the GEMM, then the --tile ones and, on TF32
    tensor cores, mma_tile's pick, the --mma-tile ones and the --mma-box ones of the case's rank and within its
    extents whose staging fits a block. A row's choice applies to the swept stage (`shape`); the other stage keeps
    the plans' pick."""

    def only(choice: DirectTile | None) -> Chooser:
        return lambda s, hw: choice if s == shape else choose_direct(s, hw)

    planned = choose_direct(shape, H200)
    out: list[tuple[str, Chooser]] = [(f"planned {describe(planned)}", choose_direct), ("gemm", only(None))]
    for tile_args in tiles:
        tile = tile_of(shape, *tile_args)
        if tile is not None:
            out.append((describe(tile), only(tile)))
    mma = mma_tile(shape, H200)
    if mma is not None:
        picks = [mma, *(dataclasses.replace(mma, v=v, box=mma_box(shape.cells, cells), slices=rest[0] if rest
                                            else mma.slices) for v, cells, *rest in mma_tiles if len(rest) < 2)]
        picks += [dataclasses.replace(mma, box=box, slices=slices or mma.slices) for box, slices in mma_boxes
                  if len(box) == len(shape.cells) and all(b <= c for b, c in zip(box, shape.cells))]
        picks = [tile for tile in picks if tile.slices in mma_slices(shape)
                 and direct_shared_bytes(tile, shape) <= H200.shared_optin_per_block]
        out.extend((f"mma {describe(tile)}", only(tile)) for tile in dict.fromkeys(picks))
    weight_mma = weight_mma_tile(shape, H200)
    if weight_mma is not None:  # --mma-tile's TILES are outer window offsets a warp here, then parts, min blocks
        picks = [weight_mma, *(dataclasses.replace(weight_mma, v=v,
                                                   box=mma_box(shape.cells, cells) if cells else weight_mma.box,
                                                   parts=rest[0] if rest else weight_mma.parts,
                                                   min_blocks=rest[1] if len(rest) > 1 else weight_mma.min_blocks)
                               for v, cells, *rest in mma_tiles)]
        picks = [tile for tile in picks if tile.threads <= 32 * MMA_WEIGHT_MAX_WARPS]
        out.extend((f"mma {describe(tile)}", only(tile)) for tile in dict.fromkeys(picks))
    weight = direct_tile(shape, H200) if shape.weight else None
    if weight is not None and weight != planned:
        out.append((describe(weight), only(weight)))
    return out


def describe(tile: DirectTile | WeightTile | None) -> str:
    if tile is None:
        return "(the GEMM)"
    box = "x".join(map(str, tile.box))
    if isinstance(tile, WeightTile):
        bounds = f" bounds{tile.min_blocks}" if tile.min_blocks > 1 else ""
        blocks = f"blocks{tile.channel_blocks}x{tile.parts}"
        return f"v{tile.v} lanes{tile.lanes} thr{tile.threads} {blocks} box{box}{bounds}"
    slices = f" slices{tile.slices}" if tile.slices > 1 else ""
    return f"v{tile.v} thr{tile.threads} cb{tile.cb} box{box}{slices}"


def time_stage(case: Case, stage: str, chooser: Chooser, inputs: dict[str, Any], cupy: Any, rounds: int,
               precision: str = "highest") -> tuple[float, Any]:
    """Median µs of one forward (or one backward of a recorded forward) on a tape whose plans take `chooser`'s
    direct tiles, and its output (y, or the input's gradient)."""
    import convgen.cuda

    backend = type("SweepBackend", (convgen.cuda.CupyBackend,), {"direct_chooser": staticmethod(chooser)})
    tape = type("SweepTape", (convgen.cuda.Tape,), {"backend_class": backend})(precision=precision)
    ids = {}
    for name in ("weight", "bias", "x"):
        tape, ids[name] = tape.leaf(inputs[name])
    op = convgen_op(case, tape, ids)
    recorded, out = op().unwrap()
    if stage == "forward":
        call, output = op, recorded.value(out)
    else:
        call = lambda: recorded.backward(out, inputs["seed"])  # noqa: E731
        output = call().unwrap()[ids["x" if stage == "backward_input" else "weight"]]
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(rounds):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(LAUNCHES_PER_ROUND):
            call()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1000 / LAUNCHES_PER_ROUND)
    return statistics.median(times), output


def time_16bit_stage(case: Case, stage: str, chooser: Chooser, inputs: tuple[Any, Any], cupy: Any, rounds: int,
                     precision: str, dtype: str) -> tuple[float, Any]:
    """Median µs of the stage alone (with its packs and reduces) on a `dtype` CUDA backend whose plans take
    `chooser`'s direct tiles, and its output widened to float32."""
    import convgen.cuda
    from kernel_ab import stage_calls
    from tile_sweep import median_us

    backend = type("SweepBackend", (convgen.cuda.CupyBackend,), {"direct_chooser": staticmethod(chooser)})
    call = stage_calls(backend(dtype, precision), case.geometry, *inputs)[stage]
    output = call()[0]
    cupy.cuda.Device().synchronize()
    wide = (output.astype(cupy.uint32) << 16).view(cupy.float32) if dtype == "bfloat16" else output.astype(cupy.float32)
    return median_us(call, rounds, cupy), wide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=STAGES, default="forward")
    parser.add_argument("--precision", choices=("highest", "high", "medium"), default="highest",
                        help="the tape's precision (the GEMM rows' tensor cores; 'medium': the --mma-tile rows)")
    parser.add_argument("--dtype", choices=("float32", *HALF_DTYPES), default="float32",
                        help="the elements (16-bit: each stage alone on a CUDA backend of that dtype)")
    known = parser.parse_known_args()[0]
    stage, precision = known.stage, known.precision
    all_cases = {case.name: case for case in (*CASES, *EXTRA_CASES)
                 if (s := stage_shape(case, stage, precision, known.dtype)) and s.m <= MMA_DIRECT_MAX_M}
    parser.add_argument("--cases", default="", help=f"comma-separated (default: all of {', '.join(all_cases)})")
    parser.add_argument("--tile", type=parse_tile, action="append", default=[],
                        help="V,THREADS or V,THREADS,CB (CB channels a step in opted-in shared memory): one more "
                             "row for every case (repeatable)")
    parser.add_argument("--mma-tile", type=parse_mma_tile, action="append", default=[],
                        help="TILES,CELLS[,SLICES]: with --precision medium, one more row for every case on TF32 "
                             "tensor cores, TILES tiles of 16 cells a warp, boxes of at most CELLS cells, the first "
                             "axis's window offsets in SLICES steps (by default the plans'; repeatable); for "
                             "--stage backward_weight TILES outer window offsets a warp, CELLS D's cells a box (0: the "
                             "plans' box), the third value the parts and a fourth the blocks an SM its registers are "
                             "fitted to")
    parser.add_argument("--mma-box", type=parse_mma_box, action="append", default=[],
                        help="AxBx...[,SLICES]: with --precision medium, one more row for every conv-shaped case of "
                             "that rank and at least those extents on TF32 tensor cores, mma_tile's pick with this box "
                             "of cells (and SLICES slices of the first axis's window offsets; by default the pick's) "
                             "(repeatable)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--list", action="store_true", help="print the rows only (no GPU)")
    args = parser.parse_args()
    names = [n for n in args.cases.split(",") if n] or list(all_cases)
    unknown = [n for n in names if n not in all_cases]
    if unknown:
        parser.error(f"--cases: unknown case {unknown[0]!r} (cases: {', '.join(all_cases)})")
    cupy = None if args.list else __import__("cupy")
    for name in names:
        case = all_cases[name]
        shape = stage_shape(case, stage, precision, args.dtype)
        assert shape is not None
        reference = None
        if cupy is None:
            inputs = None
        elif args.dtype == "float32":
            inputs = make_device_inputs(case, cupy)
        else:
            inputs = random_inputs(cupy, case.geometry, args.dtype, seed=7)
        for label, chooser in rows(shape, args.tile, args.mma_tile, args.mma_box):
            if cupy is None:
                print(f"{name:18s} {label}")
                continue
            if args.dtype == "float32":
                us, output = time_stage(case, stage, chooser, inputs, cupy, args.rounds, precision)
            else:
                us, output = time_16bit_stage(case, stage, chooser, inputs, cupy, args.rounds, precision, args.dtype)
            reference = output if reference is None else reference
            err = float(cupy.linalg.norm(output - reference) / cupy.linalg.norm(reference))
            print(f"{name:18s} {label:44s} {us:9.1f} us  err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
