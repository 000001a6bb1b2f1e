// Building blocks of the small-channel direct kernels (templates/cuda/_direct_conv.cu.j2), inlined into each
// conv source by `convgen build`. Needs `scalar` (common.cuh) and load4, fused_multiply_add (gemm_tile.cuh).

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
