"""benchmarks/sass_mix.py's reading of cuobjdump output: kernels split apart, the main loop found as the
backward branch's body with the most multiply-adds, its opcodes counted (canned SASS; no toolkit needed)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sass_mix

SASS = """
	code for sm_90
		Function : conv_r1_forward
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                     /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                         /* 0x0000000000007919 */
        /*0020*/                   IADD3 R2, R0, 0x1, RZ ;                    /* 0x0000000100027810 */
        /*0030*/                   LDS.128 R4, [R2] ;                         /* 0x0000000002047984 */
        /*0040*/                   FFMA R8, R4, R5, R8 ;                      /* 0x0000000504087223 */
        /*0050*/                   FFMA R9, R6, R7, R9 ;                      /* 0x0000000706097223 */
        /*0060*/              @!P0 BRA 0x20 ;                                 /* 0x0000000000008947 */
        /*0070*/                   FFMA R10, R4, R4, R10 ;                    /* 0x000000040a0a7223 */
        /*0080*/               @P1 BRA 0x70 ;                                 /* 0x0000000000001947 */
        /*0090*/                   BRA 0xa0 ;                                 /* 0x0000000000007947 */
        /*00a0*/                   EXIT ;                                     /* 0x000000000000794d */
		..........
		Function : conv_r1_forward_mma
        /*0000*/                   HMMA.1688.F32.TF32 R8, R4, R2, R8 ;        /* 0x000000020408723c */
        /*0010*/              @!P0 BRA 0x0 ;                                  /* 0x0000000000008947 */
        /*0020*/                   FFMA R8, R4, R5, R8 ;                      /* 0x0000000504087223 */
        /*0030*/                   FFMA R9, R6, R7, R9 ;                      /* 0x0000000706097223 */
        /*0040*/              @!P1 BRA 0x20 ;                                 /* 0x0000000000008947 */
		..........
		Function : conv_r1_forward_wgmma
        /*0000*/                   LDS R88, [R104] ;                          /* 0x0000000068587984 */
        /*0010*/                   WARPGROUP.ARRIVE ;                         /* 0x00000000000079c5 */
        /*0020*/                   HGMMA.64x128x8.F32.TF32 R24, R88, gdesc[UR8], R24 ;  /* 0x05e0000858187df0 */
        /*0030*/                   HGMMA.64x128x8.F32.TF32 R24, R92, gdesc[UR8], R24, gsb0 ;  /* 0x05e000085c187df0 */
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;            /* 0x00008000000079c5 */
        /*0050*/              @!P1 BRA 0x0 ;                                  /* 0xfffffffc00849947 */
        /*0060*/                   FFMA R8, R4, R5, R8 ;                      /* 0x0000000504087223 */
        /*0070*/                   FFMA R9, R6, R7, R9 ;                      /* 0x0000000706097223 */
        /*0080*/                   FFMA R9, R6, R7, R9 ;                      /* 0x0000000706097223 */
        /*0090*/              @!P1 BRA 0x60 ;                                 /* 0x0000000000009947 */
		..........
		Function : conv_r1_backward_weight
        /*0000*/                   LDG.E.CONSTANT R2, desc[UR4][R6.64] ;      /* 0x0000000406027981 */
        /*0010*/                   FFMA R8, R4, R5, R8 ;                      /* 0x0000000504087223 */
        /*0020*/                   LDG.E.CONSTANT R3, desc[UR4][R6.64+0x4] ;  /* 0x0000040406037981 */
        /*0030*/                   FFMA R9, R4, R5, R9 ;                      /* 0x0000000504097223 */
        /*0040*/                   STS [R10], R2 ;                            /* 0x000000020a007388 */
        /*0050*/              @!P0 BRA 0x0 ;                                  /* 0x0000000000008947 */
		..........
		Function : conv_r1_forward_reduce
        /*0000*/                   MOV R1, c[0x0][0x28] ;                     /* 0x00000a00ff017b82 */
        /*0010*/                   EXIT ;                                     /* 0x000000000000794d */
"""


def test_kernels_are_read_apart_in_address_order():
    kernels = sass_mix.functions(SASS)
    assert list(kernels) == ["conv_r1_forward", "conv_r1_forward_mma", "conv_r1_forward_wgmma",
                             "conv_r1_backward_weight", "conv_r1_forward_reduce"]
    assert [op for _, op, _ in kernels["conv_r1_forward_reduce"]] == ["MOV", "EXIT"]
    assert kernels["conv_r1_forward"][6] == (0x60, "BRA", " 0x20 ")


def test_the_main_loop_is_the_backward_branch_with_the_most_multiply_adds():
    kernels = sass_mix.functions(SASS)
    loop = sass_mix.main_loop("conv_r1_forward", kernels["conv_r1_forward"])
    # 0x20..0x60 (two FFMAs) beats 0x70..0x80 (one); the forward BRA 0xa0 is no loop.
    assert (loop.instructions, loop.multiply_adds) == (5, 2)
    assert loop.opcodes == {"FFMA": 2, "IADD3": 1, "LDS": 1, "BRA": 1}
    assert loop.per_multiply_add == 2.5
    assert sass_mix.main_loop("conv_r1_forward_reduce", kernels["conv_r1_forward_reduce"]) is None


def test_the_global_loads_issued_before_the_first_multiply_add_are_counted():
    kernels = sass_mix.functions(SASS)
    loop = sass_mix.main_loop("conv_r1_backward_weight", kernels["conv_r1_backward_weight"])
    assert (loop.early_loads, loop.global_loads) == (1, 2)  # the second LDG waits behind the first FFMA
    loop = sass_mix.main_loop("conv_r1_forward", kernels["conv_r1_forward"])
    assert (loop.early_loads, loop.global_loads) == (0, 0)


def test_a_tensor_core_loop_is_the_main_loop_before_an_fma_loop_with_more_multiply_adds():
    kernels = sass_mix.functions(SASS)
    loop = sass_mix.main_loop("conv_r1_forward_mma", kernels["conv_r1_forward_mma"])
    assert (loop.instructions, loop.multiply_adds, loop.opcodes) == (2, 1, {"HMMA": 1, "BRA": 1})


def test_help_shows_the_source_options_without_compiling(capsys):
    """--help is answered, not passed to `convgen source` and its help text compiled as CUDA."""
    assert sass_mix.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The static instruction mix") and "--arch ARCH" in out


def test_a_wgmma_loop_counts_its_hgmma_as_the_multiply_adds():
    """Hopper's warpgroup mma (HGMMA) marks the tensor-core loop too, before the FMA fallback's longer one."""
    kernels = sass_mix.functions(SASS)
    loop = sass_mix.main_loop("conv_r1_forward_wgmma", kernels["conv_r1_forward_wgmma"])
    assert (loop.instructions, loop.multiply_adds) == (6, 2)
    assert loop.opcodes == {"HGMMA": 2, "WARPGROUP": 2, "LDS": 1, "BRA": 1}


HAZARD = """
		Function : conv_r1_forward_wgmma
        /*0000*/                   WARPGROUP.ARRIVE ;                         /* 0x00000000000079c5 */
        /*0010*/                   HGMMA.64x64x8.F32.TF32 R24, R56, gdesc[UR8], RZ, !UPT ;  /* 0x0 */
        /*0020*/                   HGMMA.64x64x8.F32.TF32 R24, R60, gdesc[UR8], R24, gsb0 ;  /* 0x0 */
        /*0030*/                   LDS.64 R62, [R2] ;                         /* 0x0 */
        /*0040*/                   STS [R57], R3 ;                            /* 0x0 */
        /*0050*/                   IMAD.IADD R64, R1, 0x1, R2 ;               /* 0x0 */
        /*0060*/                   WARPGROUP.ARRIVE ;                         /* 0x0 */
        /*0070*/                   HGMMA.64x64x8.F32.TF32 R24, R64, gdesc[UR8], R24, gsb0 ;  /* 0x0 */
        /*0080*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;            /* 0x0 */
        /*0090*/              @P0  MOV R58, R3 ;                              /* 0x0 */
        /*00a0*/                   MOV R66, R3 ;                              /* 0x0 */
        /*00b0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;            /* 0x0 */
        /*00c0*/                   MOV R65, R3 ;                              /* 0x0 */
"""


def test_writes_of_an_issued_wgmmas_a_registers_before_its_wait_are_found():
    """LDS.64 R62 writes R63 of the first group's A (R60..R63) while it runs; a store's first operand is an
    address; R64 before the second HGMMA issues is no hazard; after DEPBAR 1 the first group is done (R58 free) but
    the second (R64..R67) still runs; after DEPBAR 0 nothing does."""
    kernels = sass_mix.functions(HAZARD)
    writes = sass_mix.in_flight_writes(kernels["conv_r1_forward_wgmma"])
    assert [(address, opcode) for address, opcode, _ in writes] == [(0x30, "LDS.64"), (0xa0, "MOV")]
