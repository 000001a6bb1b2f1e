// The tensor-core slices of the implicit-GEMM kernels (MMA_MODE 1 and 3: TF32; 2: 16-bit elements;
// docs/DESIGN.md, the tensor-core slice), inlined into each conv source by `convgen build` before
// gemm.cuh, whose slice_product calls them. Needs SHARED_ROW_PAD (printed from the contract).

// Tensor cores (MMA_MODE 1 and 3, float only): mma.sync.m16n8k8 with TF32 operands and float
// accumulators. A TF32 value is a float with its mantissa cut to 10 bits, rounded to nearest, ties away
// (cvt.rna.tf32.f32). The staged values reaching here are finite and below 0x7f7ff000 in magnitude (the
// main loop sends the others down the rare path: rare_value), and for those adding half a TF32 unit to
// the bits and cutting is that rounding exactly: two integer operations, where cvt.rna's own guards
// for inf and NaN cost four.
__device__ __forceinline__ unsigned to_tf32(float x)
{
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

// 3xTF32's split: x = big + small + O(2^-22 |x|), big and small TF32, each rounded to nearest. x - big
// is exact (Sterbenz) and finite, since big is (x has no overflowing rounding: see to_tf32).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small)
{
    big = to_tf32(x);
    small = to_tf32(x - __uint_as_float(big));
}

// The slices of the cp.async pipeline (STAGES > 2) hold values as loaded, which may be inf, NaN or past
// TF32's range: they are rounded at each fragment read by cvt.rn, one F2FP on sm_90 (cvt.rna takes a
// compare and a predicated add). Round to nearest even; inf and NaN stay what they are and values past
// the largest TF32 become inf, so whatever the integer rounding above would get wrong shows as a
// non-finite accumulator, which sends the block down the rare path (gemm_async_loop).
__device__ __forceinline__ unsigned rounded_tf32(float x)
{
#ifdef CONVGEN_EMULATED
    return emulated_rounded_tf32(x);
#else
    unsigned r;
    asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
#endif
}
// 3xTF32's split of such a value: big + small, each rounded by cvt.rn. x = inf or NaN gives a NaN small
// part, x past TF32's range an inf big one: either way the products are not finite.
__device__ __forceinline__ void split_rounded_tf32(float x, unsigned& big, unsigned& small)
{
    big = rounded_tf32(x);
    small = rounded_tf32(x - __uint_as_float(big));
}

// cvt.rna.tf32.f32 of any float (the `_wgpack` kernels' rounding of an operand once a call): ties away, inf and
// NaN kept, values past the largest TF32 made inf.
__device__ __forceinline__ unsigned rna_tf32(float x)
{
#ifdef CONVGEN_EMULATED
    return emulated_rna_tf32(x);
#else
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
#endif
}

#ifndef CONVGEN_EMULATED  // tests/emulated_cupy.py runs these sources on the CPU with its own mma_tf32
// c += a b for one 16 x 8 x 8 tile: a and b TF32 fragments, c the float C fragment (PTX ISA layouts:
// a0..a3 at (row, k) (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); b0, b1 at (k, col) (t, g), (t + 4, g);
// c0..c3 at (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1); g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_tf32(float& c0, float& c1, float& c2, float& c3, const unsigned (&a)[4],
                                         const unsigned (&b)[2])
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a b for one 16 x 8 x 16 tile of the 16-bit element type (ELEMENT_BF16: bfloat16, else float16),
// float accumulation: each fragment register holds two elements of consecutive k, the lower k in the
// low half (a0..a3 at (row, k) (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..); b0, b1 at
// (k, col) (2t.., g), (2t + 8.., g); c as mma_tf32's).
#if ELEMENT_BF16
#define MMA16_TYPE "bf16"
#else
#define MMA16_TYPE "f16"
#endif
__device__ __forceinline__ void mma_16bit(float& c0, float& c1, float& c2, float& c3, const unsigned (&a)[4],
                                          const unsigned (&b)[2])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA16_TYPE "." MMA16_TYPE ".f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// The mma tile (mi, ni) of a warp: acc's 2 x 2 block at (2 mi, 2 ni) is its C fragment (tile_row, tile_col);
// TF32 operands, or 16-bit ones with SIXTEEN.
template <bool SIXTEEN = false, unsigned TM, unsigned TN>
__device__ __forceinline__ void mma_tile(float (&acc)[TM][TN], unsigned mi, unsigned ni, const unsigned (&a)[4],
                                         const unsigned (&b)[2])
{
    if constexpr (SIXTEEN) {
        mma_16bit(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni], acc[2 * mi + 1][2 * ni + 1],
                  a, b);
    } else {
        mma_tf32(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni], acc[2 * mi + 1][2 * ni + 1],
                 a, b);
    }
}

// One staged slice on the tensor cores: acc += As^T Bs in k steps of 8, each warp over its warp tile
// (tile_owner). The order of the 8 products inside an mma is the hardware's, so fragment k position t
// may read any slice row as long as A and B agree: t reads row 2t and t + 4 row 2t + 1, which puts a
// warp's 32 fragment reads on 32 distinct banks (rows are BM + SHARED_ROW_PAD = 4 mod 8 words apart)
// where rows t and t + 4 would pair them up. MODE 1: one mma of values rounded to TF32 when staged
// (staged_value), into acc. MODE 3: each value split into big + small here, and the three products
// big*big, big*small and small*big summed from zero over the slice's k steps, then added to acc with
// a rounding add. RAW: the slices hold values as loaded (the cp.async pipeline), rounded or split here
// with cvt.rn (rounded_tf32). acc never meets the tensor cores, whose float accumulation truncates: the H200 gave
// 3xTF32 3-6x the FMA path's error when acc took every product, grad_weight worst. In the slice's short
// sum the small products (~2^-11 of the big ones) stay 12 bits above its last place, so they need no
// accumulators of their own across the reduction: that register tile would cost a block per SM
// (docs/DESIGN.md, the tensor-core slice).
template <unsigned MODE, bool RAW, unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN>
__device__ __forceinline__ void slice_mma(const float (&As)[BK][BM + SHARED_ROW_PAD],
                                          const float (&Bs)[BK][BN + SHARED_ROW_PAD], unsigned tm, unsigned tn,
                                          float (&acc)[TM][TN])
{
    static_assert(BK % 8 == 0 && TM % 2 == 0 && TN % 2 == 0, "whole mma tiles and k steps");
    const unsigned g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const unsigned row = tm * 8 * TM + g, col = tn * 4 * TN + g;
    [[maybe_unused]] float slice_sum[TM][TN];
    float (&sum)[TM][TN] = MODE == 3 ? slice_sum : acc;  // TF32 accumulates in acc, as cuDNN's TF32 does
    if constexpr (MODE == 3) {
#pragma unroll
        for (unsigned i = 0; i < TM; ++i) {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                slice_sum[i][j] = 0;
            }
        }
    }
#pragma unroll
    for (unsigned k0 = 0; k0 < BK; k0 += 8) {
        const float* a_lo = As[k0 + 2 * t];  // k position t
        const float* a_hi = As[k0 + 2 * t + 1];  // k position t + 4
        const float* b_lo = Bs[k0 + 2 * t];
        const float* b_hi = Bs[k0 + 2 * t + 1];
        unsigned a_big[TM / 2][4], a_small[TM / 2][4], b_big[TN / 2][2], b_small[TN / 2][2];
#pragma unroll
        for (unsigned mi = 0; mi < TM / 2; ++mi) {
            const float a[4] = {a_lo[row + 16 * mi], a_lo[row + 16 * mi + 8], a_hi[row + 16 * mi],
                                a_hi[row + 16 * mi + 8]};
#pragma unroll
            for (unsigned r = 0; r < 4; ++r) {
                if constexpr (MODE == 3 && RAW) {
                    split_rounded_tf32(a[r], a_big[mi][r], a_small[mi][r]);
                } else if constexpr (MODE == 3) {
                    split_tf32(a[r], a_big[mi][r], a_small[mi][r]);
                } else {
                    a_big[mi][r] = RAW ? rounded_tf32(a[r]) : __float_as_uint(a[r]);
                }
            }
        }
#pragma unroll
        for (unsigned ni = 0; ni < TN / 2; ++ni) {
            const float b[2] = {b_lo[col + 8 * ni], b_hi[col + 8 * ni]};
#pragma unroll
            for (unsigned r = 0; r < 2; ++r) {
                if constexpr (MODE == 3 && RAW) {
                    split_rounded_tf32(b[r], b_big[ni][r], b_small[ni][r]);
                } else if constexpr (MODE == 3) {
                    split_tf32(b[r], b_big[ni][r], b_small[ni][r]);
                } else {
                    b_big[ni][r] = RAW ? rounded_tf32(b[r]) : __float_as_uint(b[r]);
                }
            }
        }
#pragma unroll
        for (unsigned mi = 0; mi < TM / 2; ++mi) {
#pragma unroll
            for (unsigned ni = 0; ni < TN / 2; ++ni) {
                if constexpr (MODE == 3) {
                    mma_tile(sum, mi, ni, a_big[mi], b_small[ni]);
                    mma_tile(sum, mi, ni, a_small[mi], b_big[ni]);
                }
                mma_tile(sum, mi, ni, a_big[mi], b_big[ni]);
            }
        }
    }
    if constexpr (MODE == 3) {
#pragma unroll
        for (unsigned i = 0; i < TM; ++i) {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                acc[i][j] += slice_sum[i][j];
            }
        }
    }
}

// One staged slice of 16-bit elements (staged_rows<2>: k pairs in words) on the tensor cores: acc += As^T Bs
// in k steps of 16, each warp over its warp tile, products summed in float by the mma into acc (16-bit
// values multiply exactly). As in slice_mma, fragment k positions may read any pair of slice rows as long
// as A and B agree: positions 2t, 2t + 1 read word row 2t of the step and 2t + 8, 2t + 9 word row 2t + 1,
// which puts a warp's fragment reads on 32 distinct banks (word rows are 4 mod 8 words apart).
template <unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN>
__device__ __forceinline__ void slice_mma16(const unsigned (&As)[BK / 2][BM + SHARED_ROW_PAD],
                                            const unsigned (&Bs)[BK / 2][BN + SHARED_ROW_PAD], unsigned tm,
                                            unsigned tn, float (&acc)[TM][TN])
{
    static_assert(BK % 16 == 0 && TM % 2 == 0 && TN % 2 == 0, "whole mma tiles and k steps");
    const unsigned g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const unsigned row = tm * 8 * TM + g, col = tn * 4 * TN + g;
#pragma unroll
    for (unsigned p0 = 0; p0 < BK / 2; p0 += 8) {
        const unsigned* a_lo = As[p0 + 2 * t];  // k positions 2t, 2t + 1
        const unsigned* a_hi = As[p0 + 2 * t + 1];  // k positions 2t + 8, 2t + 9
        const unsigned* b_lo = Bs[p0 + 2 * t];
        const unsigned* b_hi = Bs[p0 + 2 * t + 1];
        unsigned a[TM / 2][4], b[TN / 2][2];
#pragma unroll
        for (unsigned mi = 0; mi < TM / 2; ++mi) {
            a[mi][0] = a_lo[row + 16 * mi], a[mi][1] = a_lo[row + 16 * mi + 8];
            a[mi][2] = a_hi[row + 16 * mi], a[mi][3] = a_hi[row + 16 * mi + 8];
        }
#pragma unroll
        for (unsigned ni = 0; ni < TN / 2; ++ni) {
            b[ni][0] = b_lo[col + 8 * ni], b[ni][1] = b_hi[col + 8 * ni];
        }
#pragma unroll
        for (unsigned mi = 0; mi < TM / 2; ++mi) {
#pragma unroll
            for (unsigned ni = 0; ni < TN / 2; ++ni) {
                mma_tile<true>(acc, mi, ni, a[mi], b[ni]);
            }
        }
    }
}
