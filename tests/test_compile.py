"""Layer 2: every generated CUDA source compiles with NVRTC for sm_90 (no GPU needed) at a
representative geometry of its rank, in float32 and float64 elements, no forward kernel spills to
local memory (no kernel at all in float64), and every kernel's signature is the one the contract
gives the launcher."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from convgen import nvrtc_check
from convgen.circular import circular_plan, representative_circular_geometry
from convgen.cuda_launch import (
    BLOCK,
    H200,
    choose_tile,
    gemm_shapes,
    plan,
    representative_geometry,
    representative_wgmma_geometry,
    tile_candidates,
)
from convgen.direct_model import no_direct
from convgen.generated.contract import (
    CIRCULAR_KERNELS,
    CIRCULAR_STAGES,
    GEMM_STAGES,
    KERNELS,
    STAGES,
    gemm_shared_bytes,
)
from convgen.generator import cli
from convgen.geometry import Family, Geometry
from forced_tiles import FORCED_GEOMETRY, MMA_FORCED_TILES, forced_chooser, mma_weight_direct

GENERATED_CUDA = Path(__file__).resolve().parent.parent / "generated" / "cuda"
SIGNATURE = re.compile(r'extern "C" __global__ void (?:\w+ )?(\w+)\(([^)]*)\)')

PTXAS_LOG = """\
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma \
instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage in the function \
'conv_r2_forward'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'conv_r2_forward' for 'sm_90'
ptxas info    : Function properties for conv_r2_forward
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'conv_r2_backward_bias' for 'sm_90'
ptxas info    : Function properties for conv_r2_backward_bias
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem
"""

SOURCES = sorted(KERNELS, key=lambda k: (k[0].value, k[1]))

# A `_wgmma` kernel its plan caps at 128 registers for two blocks an SM (<PREFIX>_WG_MIN_BLOCKS 2) may spill a few
# values it keeps across the main loop: on the H200 such kernels ran 6-21% faster than uncapped at one block an SM
# (benchmarks/NOTES.md, eighteenth session). More than this many bytes would be a register tile that does not fit.
CAPPED_WGMMA_SPILL_BYTES = 64
# Likewise the tensor-core direct weight kernel fitted to two blocks an SM (BWW_DIRECT_MIN_BLOCKS 2, 72 registers at
# 448 threads): at conv4d 16 -> 16 8x32³ 8-16 bytes stored and up to 36 loaded, where its whole backward ran 4% faster
# than at one block an SM in float32 and its stage 4% slower in bfloat16 (benchmarks/NOTES.md, forty-eighth session).
CAPPED_DIRECT_WEIGHT_SPILL_BYTES = 48


def unexpected_spills(report, defines: dict[str, int]) -> list:
    """The kernels of `report` that spill, but for capped `_wgmma` kernels within CAPPED_WGMMA_SPILL_BYTES and the
    capped direct weight kernel within CAPPED_DIRECT_WEIGHT_SPILL_BYTES."""
    def allowance(kernel) -> int:
        if kernel.symbol.endswith("_backward_weight_direct") and defines.get("BWW_DIRECT_MIN_BLOCKS", 1) > 1:
            return CAPPED_DIRECT_WEIGHT_SPILL_BYTES
        capped = any(kernel.symbol.endswith(f"_{stage}_wgmma") and defines.get(f"{prefix}_WG_MIN_BLOCKS") == 2
                     for stage, prefix in GEMM_STAGES.items())
        return CAPPED_WGMMA_SPILL_BYTES if capped else 0

    return [k for k in report.kernels if k.spills and not (
        allowance(k) and max(k.spill_store_bytes, k.spill_load_bytes) <= allowance(k))]


def _ids(value):
    return getattr(value, "value", value)


def test_ptxas_log_is_read_per_kernel():
    assert nvrtc_check.parse_ptxas_log(PTXAS_LOG) == (
        nvrtc_check.KernelReport("conv_r2_forward", 40, 0, 0, 0, serialized_wgmma=True),
        nvrtc_check.KernelReport("conv_r2_backward_bias", 255, 16, 8, 12),
    )


def _declared(param: str) -> tuple[str, str, bool, bool]:
    """`const float* __restrict__ x` -> (name, dtype, const, pointer)."""
    words = param.replace("__restrict__", "").replace("*", " * ").split()
    return words[-1], next(w for w in words if w not in ("const", "*")), "const" in words, "*" in words


def _assert_signatures(entry, stages) -> None:
    text = (GENERATED_CUDA / entry.source).read_text()
    found = {symbol: [_declared(p) for p in params.split(",")] for symbol, params in SIGNATURE.findall(text)}
    assert list(found) == list(entry.symbols.values())
    for stage, symbol in entry.symbols.items():
        expected = [(p.name, p.dtype, p.const, p.pointer) for p in stages[stage]]
        assert found[symbol] == expected, symbol


@pytest.mark.parametrize(("family", "rank"), SOURCES, ids=_ids)
def test_kernel_signatures_match_the_contract(family, rank):
    """The launcher builds arguments from the contract: the generated signatures must agree."""
    _assert_signatures(KERNELS[(family, rank)], STAGES[family])


@pytest.mark.parametrize("rank", sorted(CIRCULAR_KERNELS))
def test_circular_signatures_match_the_contract(rank):
    _assert_signatures(CIRCULAR_KERNELS[rank], CIRCULAR_STAGES)


def test_every_source_checks_for_the_defines_the_contract_lists():
    entries = [KERNELS[key] for key in SOURCES] + list(CIRCULAR_KERNELS.values())
    assert len(entries) == len(list(GENERATED_CUDA.glob("*.cu")))
    for entry in entries:
        text = (GENERATED_CUDA / entry.source).read_text()
        check = text[text.index("#if !defined"):text.index("#error")]
        assert re.findall(r"!defined\((\w+)\)", check) == list(entry.defines), entry.source


def test_circular_conv_runs_the_ordinary_conv_on_the_wrapped_input():
    """Extents in + 2p, padding 0, the other §8 arguments kept; the same output; one thread per
    padded cell (pad) and per input cell (fold)."""
    geom = Geometry.build(Family.CONV, 4, 6, (5, 3, 2), (3, 2, 2), (2, 1, 1), (5, 1, 0), batch=3, dilation=(1, 2, 1),
                          groups=2, circular=True)
    circular = circular_plan(geom)
    assert circular.padded == Geometry.build(Family.CONV, 4, 6, (15, 5, 2), (3, 2, 2), (2, 1, 1), (0, 0, 0), batch=3,
                                             dilation=(1, 2, 1), groups=2)
    assert circular.padded.output_shape == geom.output_shape == (3, 6, 7, 3, 1)
    assert circular.defines == {"IN_C": 4, "BLOCK": BLOCK, "ELEMENT_BYTES": 4, "ELEMENT_BF16": 0, "IN0": 5, "P0": 5,
                                "IN1": 3, "P1": 1, "IN2": 2, "P2": 0}
    assert circular_plan(geom, "float64").defines == {**circular.defines, "ELEMENT_BYTES": 8}
    assert circular_plan(geom, "bfloat16").defines == {**circular.defines, "ELEMENT_BYTES": 2, "ELEMENT_BF16": 1}
    assert (circular.pad_blocks, circular.fold_blocks) == (-(-3 * 4 * 150 // BLOCK), -(-3 * 4 * 30 // BLOCK))


def test_the_element_type_is_a_define_of_the_plan():
    """float32 and float64 plans differ in ELEMENT_BYTES; the float64 tiles keep their staged slices
    within a block's 48 KB of static shared memory with 8-byte elements (some float32 tiles would not)."""
    geom = Geometry.build(Family.CONV, 40, 24, (9, 9), (3, 3), (1, 1), (1, 1), batch=3)
    single, double = plan(geom), plan(geom, dtype="float64")
    assert (single.defines["ELEMENT_BYTES"], double.defines["ELEMENT_BYTES"]) == (4, 8)
    assert plan(representative_geometry(Family.AVG_POOL, 2), dtype="float64").defines["ELEMENT_BYTES"] == 8
    for shape in gemm_shapes(geom, 8).values():
        tiles = tile_candidates(shape, H200)
        assert tiles and all(gemm_shared_bytes(t.bm, t.bn, t.bk, 8) <= H200.shared_per_block for t in tiles)
    single_tiles = tile_candidates(gemm_shapes(geom)["backward_weight"], H200)
    assert [t for t in single_tiles if gemm_shared_bytes(t.bm, t.bn, t.bk, 8) > H200.shared_per_block]


def register_loop_tile(shape, hardware):
    """The tile model's pick with the cp.async pipeline off."""
    return choose_tile(replace(shape, pipelined=False), hardware)


def test_16_bit_plans_run_float32_fmas_or_their_own_mma():
    """float16 and bfloat16 in "highest" differ from float32 only in their element defines (FMAs on values
    staged and summed in float32: float32's tiles); in "medium" they take the 16-bit mma (MMA_MODE 2) on the
    TF32 mma's tiles where those cut whole k steps of 16, else the TF32 mma (1) on their widened values; its
    register loop's tiles (the cp.async pipeline takes float32 elements), and the `_wgmma` kernels as float32's
    but with four slices in shared memory (a slice's products stay in flight), the conv-shaped ones capped for two
    blocks an SM (their 16-bit loads held in registers took more than 128) and, up to an N of 64, slices of 64."""
    geom = Geometry.build(Family.CONV, 40, 24, (9, 9), (3, 3), (1, 1), (1, 1), batch=3)
    for dtype, bf16 in (("float16", 0), ("bfloat16", 1)):
        half, single = plan(geom, dtype=dtype), plan(geom)
        assert half.defines == {**single.defines, "ELEMENT_BYTES": 2, "ELEMENT_BF16": bf16}
        assert half.launches == single.launches and half.splits == single.splits
        medium = plan(geom, dtype=dtype, precision="medium").defines
        tf32 = plan(geom, precision="medium", choose_tile=register_loop_tile).defines
        assert (medium["FWD_WGMMA"], medium["BWI_WGMMA"]) == (0, 1)  # 24 and 40 dst channels
        assert medium == {**tf32, "ELEMENT_BYTES": 2, "ELEMENT_BF16": bf16, "MMA_MODE": 2,  # TF32's tiles
                          **{f"{prefix}_MMA": 2 for prefix in ("FWD", "BWI", "BWW")}, "BWI_WG_MIN_BLOCKS": 2,
                          "BWI_WG_STAGES": 4, "BWI_WG_K": 64}
        assert tf32["BWI_WG_K"] == 32
        assert tf32["BWI_WG_MIN_BLOCKS"] == 1
        assert all(medium[f"{prefix}_BK"] % 16 == 0 for prefix in ("FWD", "BWI", "BWW"))
        few = Geometry.build(Family.CONV, 8, 8, (9, 9), (3, 3), (1, 1), (1, 1), batch=3)  # k steps of 8
        assert plan(few, dtype=dtype, precision="medium").defines["MMA_MODE"] == 1
    with pytest.raises(ValueError, match="^plan: precision 'high' splits float32 operands into two TF32 parts; "
                                         "bfloat16 values are exact in TF32, so bfloat16 takes 'medium' "
                                         r"\(tensor cores\) or 'highest'$"):
        plan(geom, dtype="bfloat16", precision="high")


def test_generated_sources_read_like_hand_written_cuda():
    for path in GENERATED_CUDA.glob("*.cu"):
        lines = path.read_text().splitlines()
        assert max(len(line) for line in lines) <= 120, path.name
        assert not [line for line in lines if line.startswith("constexpr unsigned M ")], path.name
        assert "\n\n\n" not in path.read_text(), path.name


pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-bindings and nvidia-cuda-nvrtc-cu12 (the test extra)")


@pytest.mark.parametrize(("family", "rank"), SOURCES, ids=_ids)
def test_source_compiles_for_sm90_without_forward_spills(family, rank):
    report = nvrtc_check.compile_source(family, rank, "sm_90")
    assert report.error is None, report.error
    assert sorted(k.symbol for k in report.kernels) == sorted(KERNELS[(family, rank)].symbols.values())
    forward = [k for k in report.kernels if k.symbol == KERNELS[(family, rank)].symbols["forward"]]
    assert forward and not forward[0].spills, forward


@pytest.mark.parametrize(("family", "rank"), SOURCES, ids=_ids)
def test_source_compiles_in_float64_without_spills(family, rank):
    report = nvrtc_check.compile_source(family, rank, "sm_90", "float64")
    assert report.error is None, report.error
    assert sorted(k.symbol for k in report.kernels) == sorted(KERNELS[(family, rank)].symbols.values())
    assert not [k for k in report.kernels if k.spills]


CONV_SOURCES = [key for key in SOURCES if key[0].is_conv]
TENSOR_CORE_PRECISIONS = ("high", "medium")


@pytest.mark.parametrize("precision", TENSOR_CORE_PRECISIONS)
@pytest.mark.parametrize(("family", "rank"), CONV_SOURCES, ids=_ids)
def test_conv_source_compiles_on_tensor_cores_without_spills(family, rank, precision):
    """The tensor-core GEMMs (MMA_MODE 3, 1) at each conv source's representative geometry, planned tiles."""
    report = nvrtc_check.compile_source(family, rank, "sm_90", "float32", precision)
    assert report.error is None, report.error
    assert sorted(k.symbol for k in report.kernels) == sorted(KERNELS[(family, rank)].symbols.values())
    assert not [k for k in report.kernels if k.spills]


@pytest.mark.parametrize("precision", TENSOR_CORE_PRECISIONS)
@pytest.mark.parametrize(("family", "rank"), CONV_SOURCES, ids=_ids)
def test_wgmma_kernels_compile_for_sm90a_without_spills(family, rank, precision):
    """The three GEMM stages' `_wgmma` and `_wgpack` kernels (32 channels each way, stride 1), compiled for sm_90a as
    their plan without the direct kernels asks (convgen compile's), each using registers (a body compiled in, not the
    empty kernel of the plans without them)."""
    geom = representative_wgmma_geometry(family, rank)
    made = plan(geom, precision=precision, direct_chooser=no_direct)
    assert made.arch == "sm_90a"
    report = nvrtc_check.compile_plan(geom, "sm_90", "float32", precision, direct_chooser=no_direct)
    assert report.error is None, report.error
    wgmma = {k.symbol: k for k in report.kernels if k.symbol.endswith(("_wgmma", "_wgpack"))}
    assert len(wgmma) == 6 and all(k.registers > 8 for k in wgmma.values()), wgmma
    assert not unexpected_spills(report, made.defines)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("family", "rank"), CONV_SOURCES, ids=_ids)
def test_tensor_core_direct_kernels_keep_their_sums_in_registers(family, rank, dtype):
    """The direct kernels on TF32 tensor cores (window slices in the conv-shaped stages, the weight gradient's form),
    forced at 16 -> 16 channels and a window of 3 a side (2 past rank 4), on float32 and on 16-bit elements: every
    direct kernel's sums stay in registers, no spill and no stack frame (an index into them that is not a constant
    would put them in local memory)."""
    kernel = (3,) * rank if rank <= 4 else (2,) * rank
    geom = Geometry.build(family, 16, 16, (6,) * rank if rank <= 4 else (3,) * rank, kernel, (1,) * rank,
                          tuple(k // 2 for k in kernel), batch=2)
    chooser = mma_weight_direct(64, 1, 2)
    defines = plan(geom, dtype=dtype, precision="medium", direct_chooser=chooser).defines
    assert defines["FWD_DIRECT_MMA"] == defines["BWI_DIRECT_MMA"] == defines["BWW_DIRECT_MMA"] == 1
    report = nvrtc_check.compile_plan(geom, "sm_90", dtype, "medium", direct_chooser=chooser)
    assert report.error is None, report.error
    direct = [k for k in report.kernels if k.symbol.endswith("_direct")]
    assert len(direct) == 3 and not [k for k in direct if k.spills or k.stack_bytes], direct


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("channels", "extents", "k", "threads"), [
    (16, (20, 20, 20, 20), 3, 448), (16, (8, 32, 32, 32), 3, 448), (24, (64, 64), 8, 256), (16, (16, 16, 16), 4, 256),
], ids=["20^4", "8x32^3", "24_64^2_k8", "16^3_k4"])
def test_the_planned_tensor_core_weight_kernel_fits_two_blocks_an_sm(channels, extents, k, threads, dtype):
    """The plan fits the tensor-core direct weight kernel of these layers to two blocks an SM of `threads` (launch
    bounds): 16 -> 16 4-D at 72 registers a thread, 24 -> 24 2-D and 16 -> 16 3-D at 128; any spill within its
    allowance."""
    rank = len(extents)
    geom = Geometry.build(Family.CONV, channels, channels, extents, (k,) * rank, (1,) * rank, (k // 2,) * rank, batch=2)
    made = plan(geom, dtype=dtype, precision="medium")
    defines = made.defines
    assert defines["BWW_DIRECT_MMA"] == 1 and defines["BWW_DIRECT_MIN_BLOCKS"] == 2
    assert made.launches["backward_weight"].block == threads
    report = nvrtc_check.compile_plan(geom, "sm_90", dtype, "medium")
    assert report.error is None, report.error
    (weight,) = [k for k in report.kernels if k.symbol.endswith("_backward_weight_direct")]
    assert weight.registers <= 65536 // (2 * threads) // 8 * 8, weight
    assert not unexpected_spills(report, defines)


@pytest.mark.parametrize("precision", TENSOR_CORE_PRECISIONS)
@pytest.mark.parametrize("tile", MMA_FORCED_TILES, ids=lambda t: "bm{}_bn{}_tm{}_tn{}_split{}_packed{}".format(*t))
def test_forced_tensor_core_tiles_compile_without_spills(tile, precision):
    """Every tile the CUDA tests force onto the tensor cores compiles (its static_asserts hold)."""
    for geom in FORCED_GEOMETRY:
        report = nvrtc_check.compile_plan(geom, "sm_90", "float32", precision, forced_chooser(*tile))
        assert report.error is None, report.error
        assert not [k for k in report.kernels if k.spills]


# SEMANTICS §8 geometries the CUDA tape computes: a batch (a kernel argument; its bucket may pick
# other tiles, here split stages and the batched weight gradient's longer reduction); dilation
# (stride phases with gcd(S, D) > 1, pools with streamed rows), groups and output padding up to rank 8.
EXTENDED = [
    Geometry.build(Family.CONV, 4, 6, (13, 10), (3, 2), (2, 1), (2, 1), dilation=(2, 3), groups=2),
    Geometry.build(Family.CONV, 6, 6, (9,) * 8, (3,) * 8, (2, 1) * 4, (1, 0) * 4, dilation=(2, 3) * 4, groups=3),
    Geometry.build(Family.CONV_TRANSPOSE, 6, 9, (7, 6), (3, 3), (2, 3), (1, 0), dilation=(3, 2), groups=3,
                   output_padding=(1, 2), batch=2),
    Geometry.build(Family.CONV_TRANSPOSE, 4, 4, (5,) * 8, (2,) * 8, (2, 1) * 4, (0, 1) * 4, dilation=(4, 2) * 4,
                   groups=2, output_padding=(1, 0) * 4),
    Geometry.build(Family.MAX_POOL, 2, 2, (7, 20), (3, 3), (1, 2), (2, 2), dilation=(2, 2)),
    Geometry.build(Family.AVG_POOL, 2, 2, (9, 80), (2, 9), (1, 2), (1, 16), dilation=(2, 9)),
    Geometry.build(Family.SMOOTH_MAX_POOL, 2, 2, (6,) * 8, (2,) * 8, (1,) * 8, (1,) * 8, -0.5, dilation=(2,) * 8),
    Geometry.build(Family.CONV, 40, 24, (9, 9), (3, 3), (1, 1), (1, 1), batch=3),
    Geometry.build(Family.CONV_TRANSPOSE, 16, 8, (30, 30, 4), (3, 2, 2), (2, 1, 2), (1, 0, 1), batch=64),
    Geometry.build(Family.MAX_POOL, 3, 3, (9, 7), (3, 3), (2, 1), (1, 1), batch=5),
    Geometry.build(Family.AVG_POOL, 3, 3, (9,), (3,), (2,), (1,), batch=2),
    Geometry.build(Family.SMOOTH_MAX_POOL, 3, 3, (5, 6, 4), (3, 2, 2), (1, 1, 2), (1, 1, 0), 0.5, batch=7),
]


@pytest.mark.parametrize("dtype", nvrtc_check.DTYPES)
@pytest.mark.parametrize("geom", EXTENDED, ids=lambda g: f"{g.family.value}_r{g.rank}_batch{g.batch}"
                                                         f"_d{'x'.join(map(str, g.dilation))}_g{g.groups}")
def test_extended_geometry_compiles_without_spills(geom, dtype):
    report = nvrtc_check.compile_plan(geom, "sm_90", dtype)
    assert report.error is None, report.error
    assert not [k for k in report.kernels if k.spills]


# The batched cases of the benchmark: the tile model's tensor-core picks must not spill (its register
# estimate once let 128x128 t8x8 3xTF32 through, at 255 registers with spills).
BENCHMARK_CONVS = [
    Geometry.build(Family.CONV, 128, 128, (128, 128), (3, 3), (1, 1), (1, 1), batch=8),
    Geometry.build(Family.CONV, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), batch=32),
    Geometry.build(Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3), batch=32),
    Geometry.build(Family.CONV, 32, 32, (32,) * 3, (3,) * 3, (1,) * 3, (1,) * 3, batch=8),
    Geometry.build(Family.CONV, 8, 8, (16,) * 4, (3,) * 4, (1,) * 4, (1,) * 4, batch=8),
]


@pytest.mark.parametrize(("dtype", "precision"), [("float32", p) for p in TENSOR_CORE_PRECISIONS] +
                         [("float16", "medium"), ("bfloat16", "medium")])
@pytest.mark.parametrize("geom", [g for g in EXTENDED if g.family.is_conv] + BENCHMARK_CONVS,
                         ids=lambda g: f"{g.family.value}_r{g.rank}_batch{g.batch}_g{g.groups}")
def test_extended_geometry_compiles_on_tensor_cores_without_spills(geom, dtype, precision):
    """... and no wgmma kernel that ptxas serializes (16-bit: its loop keeps a slice's products in flight)."""
    report = nvrtc_check.compile_plan(geom, "sm_90", dtype, precision)
    assert report.error is None, report.error
    assert not unexpected_spills(report, plan(geom, dtype=dtype, precision=precision).defines)
    assert not [k.symbol for k in report.kernels if k.serialized_wgmma]


def test_only_capped_wgmma_kernels_may_spill_and_only_a_little():
    kernel = nvrtc_check.KernelReport("conv_r2_backward_weight_wgmma", 128, 16, 12, 12)
    assert unexpected_spills(stand_in_report(kernel), {"BWW_WG_MIN_BLOCKS": 2}) == []
    assert unexpected_spills(stand_in_report(kernel), {"BWW_WG_MIN_BLOCKS": 1}) == [kernel]
    assert unexpected_spills(stand_in_report(kernel), {"FWD_WG_MIN_BLOCKS": 2}) == [kernel]
    heavy = replace(kernel, spill_store_bytes=CAPPED_WGMMA_SPILL_BYTES + 4)
    assert unexpected_spills(stand_in_report(heavy), {"BWW_WG_MIN_BLOCKS": 2}) == [heavy]
    gemm = replace(kernel, symbol="conv_r2_backward_weight")
    assert unexpected_spills(stand_in_report(gemm), {"BWW_WG_MIN_BLOCKS": 2}) == [gemm]


def stand_in_report(*kernels):
    """A stand-in compile report holding `kernels`."""
    return type("Report", (), {"kernels": kernels})()


# The circular-padding sources (pad and fold) at every rank: padding of a whole period on the first
# axis (three copies of a cell), none on the last, a batch; and a rank-3 case with p = in everywhere.
CIRCULAR = [representative_circular_geometry(rank) for rank in sorted(CIRCULAR_KERNELS)] + [
    Geometry.build(Family.CONV, 2, 3, (4, 3, 5), (3, 3, 2), (1, 2, 1), (4, 3, 5), batch=5, circular=True)]


@pytest.mark.parametrize("dtype", nvrtc_check.DTYPES)
@pytest.mark.parametrize("geom", CIRCULAR, ids=lambda g: f"r{g.rank}_p{'x'.join(map(str, g.padding))}")
def test_circular_source_compiles_without_spills(geom, dtype):
    report = nvrtc_check.compile_circular(geom, "sm_90", dtype)
    assert report.error is None, report.error
    assert sorted(k.symbol for k in report.kernels) == sorted(CIRCULAR_KERNELS[geom.rank].symbols.values())
    assert not [k for k in report.kernels if k.spills]


def test_a_bad_arch_is_one_usage_error():
    result = CliRunner().invoke(cli.main, ["compile", "--arch", "sm_91"])
    assert result.exit_code == 2
    supported = ", ".join(nvrtc_check.supported_architectures())
    assert result.output == f"convgen compile: unknown architecture 'sm_91'; this NVRTC supports {supported}\n"


def test_compile_without_nvrtc_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cuda.bindings", None)
    result = CliRunner().invoke(cli.main, ["compile"])
    assert result.exit_code == 2
    assert result.output.startswith("convgen compile: NVRTC is not installed (")
    assert result.output.endswith("); install it with: pip install 'convgen[test]'\n")


def test_source_command_prints_a_standalone_nvrtc_input():
    """`convgen source` output compiles with no -D options: the defines are in the text."""
    result = CliRunner().invoke(cli.main, ["source", "conv_transpose", "2", "--in-c", "5", "--out-c", "7",
                                           "--in", "9x8", "--kernel", "3", "--stride", "2x1", "--padding", "1x0"])
    assert result.exit_code == 0, result.output
    assert "#define IN_C 5\n#define OUT_C 7\n" in result.output
    assert "#define OUT0 17\n" in result.output  # (9 - 1) * 2 + 3 - 2
    bindings = nvrtc_check.nvrtc()
    _, program = bindings.nvrtcCreateProgram(result.output.encode(), b"standalone.cu", 0, [], [])
    try:
        (status,) = bindings.nvrtcCompileProgram(program, 2, [b"--std=c++17", b"--gpu-architecture=sm_90"])
    finally:
        bindings.nvrtcDestroyProgram(program)
    assert status == bindings.nvrtcResult.NVRTC_SUCCESS


def test_source_command_takes_the_section_8_arguments():
    """Dilation, groups, batch and dtype reach the defines: D0/D1, GROUPS, ELEMENT_BYTES, and tiles chosen
    for the batch (a batch of 64 gets larger backward_input tiles than one image of this size)."""
    args = ["source", "conv", "2", "--in-c", "64", "--out-c", "64", "--in", "16", "--kernel", "3", "--stride", "1",
            "--padding", "2", "--dilation", "2x1"]
    result = CliRunner().invoke(cli.main, [*args, "--groups", "4", "--dtype", "float64"])
    assert result.exit_code == 0, result.output
    for define in ("D0 2", "D1 1", "GROUPS 4", "ELEMENT_BYTES 8", "OUT0 16", "OUT1 18"):
        assert f"#define {define}\n" in result.output
    batched = CliRunner().invoke(cli.main, [*args, "--batch", "64"])
    one_image = CliRunner().invoke(cli.main, args)
    assert "#define ELEMENT_BYTES 4\n" in batched.output
    sides = lambda output: [int(re.search(rf"#define BWI_{side} (\d+)\n", output)[1]) for side in ("BM", "BN")]  # noqa: E731
    assert sides(one_image.output) == [16, 16]
    assert min(sides(batched.output)) >= 64


def test_source_command_rejects_groups_that_do_not_divide_the_channels():
    result = CliRunner().invoke(cli.main, ["source", "conv", "2", "--in-c", "6", "--out-c", "4", "--groups", "4"])
    assert result.exit_code == 2
    assert "convgen source: groups=4 needs a conv family whose in_c (6) and out_c (4) it divides" in result.output


def test_source_command_rejects_a_wrong_axis_count():
    result = CliRunner().invoke(cli.main, ["source", "max_pool", "3", "--in", "4x4"])
    assert result.exit_code == 2
    assert "Invalid value for --in: '4x4' needs 3 non-negative extents (rank 3)" in result.output


def test_representative_geometry_has_every_family():
    assert {representative_geometry(f, 1).family for f in Family} == set(Family)
