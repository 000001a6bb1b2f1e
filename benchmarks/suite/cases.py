"""The benchmark cases, as `Geometry` values, with the physical floor of each forward (the H200 figures
DESIGN.md uses): the unbatched cases of DESIGN.md "Figures to beat" (one image) and the batched cases of
issue 9 (a batch of images, as PyTorch users train), with cuDNN's reference times for the latter."""

from __future__ import annotations

import math
from dataclasses import dataclass

from convgen.geometry import Family, Geometry

FP32_FMA_FLOPS = 50.8e12  # H200 figures used by DESIGN.md for the physical floor
HBM_BYTES_PER_S = 4.07e12
GRAPH_COPIES_MAX = 10  # calls per captured graph, to hide the graph-launch gap behind small kernels
GRAPH_MEMORY_BUDGET = 2 << 30  # ... unless the copies' buffers would exceed this


REFERENCE_DATE = "2026-11-30"  # when the cuDNN reference times of the batched cases were measured (H200)


@dataclass(frozen=True)
class ReferenceTimes:
    """cuDNN strict fp32 on the H200, measured on REFERENCE_DATE, in ms: the figures a batched case is
    compared with across runs (each run also measures cuDNN itself)."""

    fwd_ms: float
    fwd_bwd_ms: float


@dataclass(frozen=True)
class Case:
    """One benchmark geometry, named. Kernel, stride and padding are the same on every spatial axis
    (the 2-D calls of the tape take them as scalars)."""

    name: str  # for --cases and the JSON
    title: str  # as DESIGN.md / issue 9 write it
    geometry: Geometry
    reference: ReferenceTimes | None = None  # batched cases only

    @classmethod
    def square(cls, name: str, title: str, family: Family, in_c: int, out_c: int, spatial: tuple[int, ...],
               k: int, stride: int, padding: int, beta: float | None = None, *, batch: int | None = None,
               reference: ReferenceTimes | None = None) -> Case:
        rank = len(spatial)
        geometry = Geometry.build(family, in_c, out_c, spatial, (k,) * rank, (stride,) * rank, (padding,) * rank,
                                  beta, batch=batch)
        return cls(name, title, geometry, reference)

    @property
    def batch(self) -> int | None:
        """None: one image without a batch axis (the tape's seed calls); n: input [n, C, *S]."""
        return self.geometry.batch

    @property
    def is_batched(self) -> bool:
        return self.geometry.batch is not None

    @property
    def op(self) -> str:
        """The family's name, as the JSON has it: "conv", "max_pool" or "smooth_max_pool"."""
        return self.geometry.family.value

    @property
    def is_conv(self) -> bool:
        return self.geometry.family.is_conv

    @property
    def rank(self) -> int:
        return self.geometry.rank

    @property
    def in_c(self) -> int:
        return self.geometry.in_c

    @property
    def out_c(self) -> int:
        return self.geometry.out_c

    @property
    def spatial(self) -> tuple[int, ...]:
        return self.geometry.in_spatial

    @property
    def kernel(self) -> tuple[int, ...]:
        return self.geometry.kernel

    @property
    def strides(self) -> tuple[int, ...]:
        return self.geometry.stride

    @property
    def paddings(self) -> tuple[int, ...]:
        return self.geometry.padding

    @property
    def k(self) -> int:
        return self.kernel[0]

    @property
    def stride(self) -> int:
        return self.strides[0]

    @property
    def padding(self) -> int:
        return self.paddings[0]

    @property
    def beta(self) -> float | None:
        """Smooth max pool only."""
        return self.geometry.beta

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.geometry.input_shape

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.geometry.output_shape

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return self.geometry.kernel_shape

    @property
    def io_bytes(self) -> int:
        """Input plus output, each once (the bandwidth figure of the pool cases)."""
        return 4 * (math.prod(self.input_shape) + self.geometry.output_numel)

    @property
    def multiply_adds(self) -> int:
        """The forward's GEMM size in multiply-adds: every output cell sums in_c × kernel products (0 for a pool)."""
        return self.geometry.output_numel * self.in_c * math.prod(self.kernel) if self.is_conv else 0

    @property
    def floor_us(self) -> float:
        """DESIGN.md's physical floor of the forward: fp32 FMA rate or HBM bandwidth, whichever binds."""
        moved = self.io_bytes
        if self.is_conv:
            moved += 4 * (math.prod(self.weight_shape) + self.out_c)
        return 1e6 * max(2 * self.multiply_adds / FP32_FMA_FLOPS, moved / HBM_BYTES_PER_S)

    @property
    def graph_copies(self) -> int:
        """Calls per captured graph: up to GRAPH_COPIES_MAX while their buffers fit the budget."""
        return max(1, min(GRAPH_COPIES_MAX, GRAPH_MEMORY_BUDGET // (4 * self.io_bytes)))


UNBATCHED_CASES = (
    Case.square("conv2d_64_56", "conv2d 64→64 56×56 k3 p1", Family.CONV, 64, 64, (56, 56), 3, 1, 1),
    Case.square("conv2d_3_224_k7", "conv2d 3→64 224×224 k7 s2 p3", Family.CONV, 3, 64, (224, 224), 7, 2, 3),
    Case.square("conv2d_256_14", "conv2d 256→256 14×14 k3 p1", Family.CONV, 256, 256, (14, 14), 3, 1, 1),
    Case.square("conv2d_128_128", "conv2d 128→128 128×128 k3 p1", Family.CONV, 128, 128, (128, 128), 3, 1, 1),
    Case.square("conv3d_32_32", "conv3d 32→32 32³ k3 p1", Family.CONV, 32, 32, (32, 32, 32), 3, 1, 1),
    Case.square("conv1d_64_4096", "conv1d 64→64 4096 k5 p2", Family.CONV, 64, 64, (4096,), 5, 1, 2),
    Case.square("conv4d_8_16", "conv4d 8→8 16⁴ k3 p1", Family.CONV, 8, 8, (16, 16, 16, 16), 3, 1, 1),
    Case.square("maxpool2d_1024", "max pool 2d C64 1024² k3 s1 p1", Family.MAX_POOL, 64, 64, (1024, 1024), 3, 1, 1),
    Case.square("smoothmax2d_1024", "smooth max 2d C64 1024² k3 s1 p1 β=1", Family.SMOOTH_MAX_POOL, 64, 64,
                (1024, 1024), 3, 1, 1, beta=1.0),
)


def batched_conv(name: str, title: str, batch: int, in_c: int, out_c: int, spatial: tuple[int, ...], k: int,
                 stride: int, padding: int, fwd_ms: float, fwd_bwd_ms: float) -> Case:
    """A batched convolution of issue 9 with its cuDNN strict fp32 reference times (fwd, fwd+bwd ms)."""
    return Case.square(name, title, Family.CONV, in_c, out_c, spatial, k, stride, padding, batch=batch,
                       reference=ReferenceTimes(fwd_ms, fwd_bwd_ms))


BATCHED_CASES = (
    batched_conv("conv2d_64_56_n32", "conv2d N32 64→64 56² k3 p1", 32, 64, 64, (56, 56), 3, 1, 1, 0.332, 0.922),
    batched_conv("conv2d_128_128_n8", "conv2d N8 128→128 128² k3 p1", 8, 128, 128, (128, 128), 3, 1, 1,
                 1.091, 3.404),
    batched_conv("conv2d_3_224_k7_n32", "conv2d N32 3→64 224² k7 s2 p3", 32, 3, 64, (224, 224), 7, 2, 3,
                 0.496, 1.695),
    batched_conv("conv3d_32_32_n8", "conv3d N8 32→32 32³ k3 p1", 8, 32, 32, (32, 32, 32), 3, 1, 1, 0.546, 3.803),
    batched_conv("conv1d_64_4096_n32", "conv1d N32 64→64 4096 k5 p2", 32, 64, 64, (4096,), 5, 1, 2, 0.208, 0.827),
    batched_conv("conv4d_8_16_n8", "conv4d N8 8→8 16⁴ k3 p1", 8, 8, 8, (16, 16, 16, 16), 3, 1, 1, 1.085, 4.114),
)
CASES = UNBATCHED_CASES + BATCHED_CASES
CASES_BY_NAME = {case.name: case for case in CASES}


def sweep_conv(name: str, batch: int, in_c: int, out_c: int, spatial: tuple[int, ...], k: int = 3) -> Case:
    """A batched k×…×k convolution of stride 1 and same padding, titled from its numbers."""
    rank, side = len(spatial), "×".join(map(str, spatial))
    return Case.square(name, f"conv{rank}d N{batch} {in_c}→{out_c} {side} k{k}", Family.CONV, in_c, out_c,
                       spatial, k, 1, k // 2, batch=batch)


# Shapes beyond the benchmark's that `tile_sweep.py --cases` also takes, for calibrating the tile model over
# more GEMM sizes than six cases give (out_c, in_c × kernel, images × cells); not benchmarked.
SWEEP_CASES = (
    sweep_conv("sweep_2d_64_56_n16", 16, 64, 64, (56, 56)),
    sweep_conv("sweep_2d_32_56_n32", 32, 32, 32, (56, 56)),
    sweep_conv("sweep_2d_128_28_n32", 32, 128, 128, (28, 28)),
    sweep_conv("sweep_2d_64_112_n8", 8, 64, 64, (112, 112)),
    sweep_conv("sweep_2d_256_14_n16", 16, 256, 256, (14, 14)),
    sweep_conv("sweep_2d_64to128_28_n32", 32, 64, 128, (28, 28)),
    sweep_conv("sweep_2d_128to64_28_n32", 32, 128, 64, (28, 28)),
    sweep_conv("sweep_2d_96_28_n64", 64, 96, 96, (28, 28)),
    sweep_conv("sweep_1d_32_4096_n32", 32, 32, 32, (4096,), k=5),
    sweep_conv("sweep_1d_128_2048_n16", 16, 128, 128, (2048,)),
    sweep_conv("sweep_3d_64_16_n4", 4, 64, 64, (16, 16, 16)),
    sweep_conv("sweep_3d_48_24_n8", 8, 48, 48, (24, 24, 24)),
)

CASE_TABLE_HEADER = ("name", "title", "op", "batch", "input", "output", "weight", "kernel", "stride", "padding",
                     "beta", "io bytes", "floor fwd µs", "graph copies",
                     f"cuDNN ref ms fwd / fwd+bwd ({REFERENCE_DATE})")


def case_table(cases: tuple[Case, ...] | list[Case] = CASES) -> str:
    """The cases as a markdown table, every derived figure computed from the Geometry (`bench.py --list`)."""

    def row(case: Case) -> tuple[object, ...]:
        reference = case.reference
        return (case.name, case.title, case.op, case.batch, case.input_shape, case.output_shape,
                case.weight_shape if case.is_conv else None, case.kernel, case.strides, case.paddings, case.beta,
                case.io_bytes, f"{case.floor_us:.12g}", case.graph_copies,
                f"{reference.fwd_ms} / {reference.fwd_bwd_ms}" if reference else None)

    lines = [CASE_TABLE_HEADER, ("---",) * len(CASE_TABLE_HEADER), *(row(case) for case in cases)]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)
