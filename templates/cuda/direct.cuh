// Building blocks of the small-channel direct kernels (templates/cuda/_direct_conv.cu.j2), inlined into each
// conv source by `convgen build`. Needs `scalar` (common.cuh), load4, fused_multiply_add (gemm_tile.cuh),
// rare_value (gemm.cuh) and mma.cuh.

// `index` hidden from nvcc's range analysis: knowing a staging loop's flat index to be under 65536, nvcc works its
// divisions by the box's extents out in 16-bit pieces, about twice the instructions of 32-bit ones (SASS of the
// conv4d N8 forward: 74 instructions a staged halo cell, 48 with this and the step's base pointer kept).
__device__ __forceinline__ unsigned opaque_index(unsigned index)
{
#ifndef CONVGEN_EMULATED
    asm("" : "+r"(index));
#endif
    return index;
}

// One window row of a thread's V cells along the last axis: `line` holds the source run they read (cell v,
// offset k at v * S + k * D), `weights` the MQ weights of each of the K offsets (dst channels fastest, padded
// to quads). The run is read once into registers; each quad of weights feeds V * 4 multiply-adds.
template <unsigned V, unsigned MB, unsigned MQ, unsigned K, unsigned S, unsigned D>
__device__ __forceinline__ void direct_row(const scalar* line, const scalar* weights, scalar (&acc)[MB][V])
{
    constexpr unsigned SPAN = (V - 1) * S + (K - 1) * D + 1;
    scalar in[SPAN];
#pragma unroll
    for (unsigned s = 0; s < SPAN; ++s) in[s] = line[s];
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
        scalar w[MQ];
#pragma unroll
        for (unsigned q = 0; q < MQ; q += 4) load4(weights + k * MQ + q, w[q], w[q + 1], w[q + 2], w[q + 3]);
#pragma unroll
        for (unsigned v = 0; v < V; ++v) {
#pragma unroll
            for (unsigned i = 0; i < MB; ++i) acc[i][v] = fused_multiply_add(w[i], in[v * S + k * D], acc[i][v]);
        }
    }
}

// The same row on the careful path (a staged weight is an inf or NaN): only source cells j = first + v * S + k * D
// with 0 <= j < extent, padding skipped rather than multiplied as zeros, over the row's `taps` offsets. Not
// unrolled: it is rare.
template <unsigned V, unsigned MB, unsigned MQ, unsigned S, unsigned D>
__device__ __forceinline__ void direct_row_inside(const scalar* line, const scalar* weights, unsigned taps,
                                                  long long first, long long extent, scalar (&acc)[MB][V])
{
    for (unsigned k = 0; k < taps; ++k) {
        for (unsigned v = 0; v < V; ++v) {
            const long long j = first + (long long)(v * S + k * D);
            if (j < 0 || j >= extent) continue;
            for (unsigned i = 0; i < MB; ++i) {
                acc[i][v] = fused_multiply_add(weights[k * MQ + i], line[v * S + k * D], acc[i][v]);
            }
        }
    }
}

// The tensor-core direct kernels (_direct_mma.cu.j2) keep a staged cell's CB channels together, as a weight row's,
// in an odd multiple of 8 words: a warp's fragment loads (rows g at words 2t, 2t + 1) then hit distinct banks.
__host__ __device__ constexpr unsigned mma_row_words(unsigned cb) { return cb / 16 * 16 + 8; }
__host__ __device__ constexpr unsigned mma_staged_words(unsigned rows, unsigned cb) { return rows * mma_row_words(cb); }
// A row of a tensor-core direct weight kernel's staging (D's cells or U's halo cells of one channel): 4 words past a
// multiple of 8, so that the rows g = 0..7 of a fragment load, 4 words t apart, hit distinct banks.
__host__ __device__ constexpr unsigned weight_mma_row_words(unsigned cells) { return (cells + 7) / 8 * 8 + 4; }

// An operand as such a kernel stages it: rounded to TF32 (to_tf32) where that integer rounding is exact, else as it
// is with `rare` set (an inf, a NaN or a value TF32 would round past its largest: gemm.cuh's rare_value), which sends
// the step down the careful path.
__device__ __forceinline__ unsigned staged_tf32(float x, bool& rare)
{
    const bool exact = !rare_value<1>(x);
    rare = rare || !exact;
    return exact ? to_tf32(x) : __float_as_uint(x);
}

// One window offset of a tensor-core direct kernel's step (8 staged channels): the warp's R tiles of 16 cells times
// its NT tiles of 8 dst channels, one mma each. `weights` points at the thread's word of the offset's first weight row
// (row g, word 2t; the n tile j's row 8j rows further), `halo` at its word of the halo cell the offset shifts cell 0
// to, `cells` the halo cells of its rows (g and g + 8 of each tile) at the window's first offset.
template <unsigned R, unsigned NT, unsigned CP>
__device__ __forceinline__ void direct_mma_offset(const unsigned* weights, const unsigned* halo,
                                                  const unsigned (&cells)[R][2], float (&acc)[R][NT][4])
{
    unsigned b[NT][2];
#pragma unroll
    for (unsigned j = 0; j < NT; ++j) {
        const uint2 pair = *reinterpret_cast<const uint2*>(weights + 8 * j * CP);
        b[j][0] = pair.x, b[j][1] = pair.y;
    }
#pragma unroll
    for (unsigned r = 0; r < R; ++r) {
        const uint2 low = *reinterpret_cast<const uint2*>(halo + cells[r][0] * CP);
        const uint2 high = *reinterpret_cast<const uint2*>(halo + cells[r][1] * CP);
        const unsigned a[4] = {low.x, high.x, low.y, high.y};
#pragma unroll
        for (unsigned j = 0; j < NT; ++j) mma_tf32(acc[r][j][0], acc[r][j][1], acc[r][j][2], acc[r][j][3], a, b[j]);
    }
}
