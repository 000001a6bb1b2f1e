// Building blocks of the implicit-GEMM kernels (conv families), inlined into each generated
// source by `convgen build`. Needs BLOCK (a define) and SHARED_ROW_PAD (printed from the contract).

// Greatest common divisor, for the stride phases of a dilated gather (compile-time constants).
__device__ __forceinline__ constexpr unsigned gcd_of(unsigned a, unsigned b) { return b ? gcd_of(b, a % b) : a; }

// Sum of N per-thread values over the block, in a fixed order (no atomics): a shuffle tree inside
// each warp, then thread 0 adds the warps in order. Every thread of the block must call it.
template <int N>
__device__ __forceinline__ void block_sum(float (&acc)[N])
{
    constexpr unsigned WARPS = (BLOCK + 31) / 32;
    __shared__ float per_warp[WARPS][N];
#pragma unroll
    for (int n = 0; n < N; ++n) {
        for (unsigned offset = 16; offset > 0; offset /= 2) {
            acc[n] += __shfl_down_sync(0xffffffffu, acc[n], offset);
        }
    }
    if (threadIdx.x % 32 == 0) {
#pragma unroll
        for (int n = 0; n < N; ++n) {
            per_warp[threadIdx.x / 32][n] = acc[n];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int n = 0; n < N; ++n) {
            acc[n] = per_warp[0][n];
            for (unsigned w = 1; w < WARPS; ++w) {
                acc[n] += per_warp[w][n];
            }
        }
    }
}

// Implicit-GEMM building blocks. Thread (tm, tn) owns rows frag_index<BM, TM>(tm, i) and columns
// frag_index<BN, TN>(tn, j) of its block's tile: with TM >= 4 the rows come in groups of 4,
// group g at g * BM / (TM / 4), so the 16-byte shared loads of a warp are contiguous.
template <unsigned B, unsigned T>
__device__ __forceinline__ constexpr unsigned frag_index(unsigned t, unsigned i)
{
    return T >= 4 ? i / 4 * (B / (T / 4)) + t * 4 + i % 4 : t * T + i;
}

template <unsigned B, unsigned T>
__device__ __forceinline__ void load_fragment(const float* row, unsigned t, float (&v)[T])
{
    if constexpr (T % 4 == 0) {
#pragma unroll
        for (unsigned g = 0; g < T / 4; ++g) {
            const float4 q = *reinterpret_cast<const float4*>(row + frag_index<B, T>(t, 4 * g));
            v[4 * g] = q.x;
            v[4 * g + 1] = q.y;
            v[4 * g + 2] = q.z;
            v[4 * g + 3] = q.w;
        }
    } else {
#pragma unroll
        for (unsigned i = 0; i < T; ++i) {
            v[i] = row[frag_index<B, T>(t, i)];
        }
    }
}

// One staged slice: acc += As^T Bs over its BK rows (shared rows padded by SHARED_ROW_PAD floats).
template <unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN>
__device__ __forceinline__ void slice_fma(const float (&As)[BK][BM + SHARED_ROW_PAD],
                                          const float (&Bs)[BK][BN + SHARED_ROW_PAD], unsigned tm, unsigned tn,
                                          float (&acc)[TM][TN])
{
#pragma unroll
    for (unsigned kk = 0; kk < BK; ++kk) {
        float a[TM], b[TN];
        load_fragment<BM, TM>(As[kk], tm, a);
        load_fragment<BN, TN>(Bs[kk], tn, b);
#pragma unroll
        for (unsigned i = 0; i < TM; ++i) {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
        }
    }
}

// A staged slice whose A holds an inf or NaN: acc += As^T Bs over only the terms whose B element
// exists, bit kk of valid_rows[n] (SEMANTICS §3 forms no product with padding, and 0 * inf would be
// NaN). The rare path: not unrolled over kk, so it adds little code.
template <unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN>
__device__ __forceinline__ void slice_fma_masked(const float (&As)[BK][BM + SHARED_ROW_PAD],
                                                 const float (&Bs)[BK][BN + SHARED_ROW_PAD],
                                                 const unsigned (&valid_rows)[BN], unsigned tm, unsigned tn,
                                                 float (&acc)[TM][TN])
{
    static_assert(BK <= 32, "one bit per slice row");
    unsigned bits[TN];
#pragma unroll
    for (unsigned j = 0; j < TN; ++j) {
        bits[j] = valid_rows[frag_index<BN, TN>(tn, j)];
    }
#pragma unroll 1
    for (unsigned kk = 0; kk < BK; ++kk) {
        float a[TM], b[TN];
        load_fragment<BM, TM>(As[kk], tm, a);
        load_fragment<BN, TN>(Bs[kk], tn, b);
#pragma unroll
        for (unsigned i = 0; i < TM; ++i) {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                if (bits[j] >> kk & 1u) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
        }
    }
}

// True when one of a thread's staged A values is an inf or NaN.
template <unsigned N>
__device__ __forceinline__ bool any_nonfinite(const float (&values)[N])
{
    bool found = false;
#pragma unroll
    for (unsigned i = 0; i < N; ++i) {
        found = found || !isfinite(values[i]);
    }
    return found;
}

// The register tile to dest[m * N + n], rows m < M and columns n < N only.
template <unsigned M, unsigned N, unsigned BM, unsigned BN, unsigned TM, unsigned TN>
__device__ __forceinline__ void store_tile(float* __restrict__ dest, unsigned m0, unsigned n0, unsigned tm,
                                           unsigned tn, const float (&acc)[TM][TN])
{
#pragma unroll
    for (unsigned i = 0; i < TM; ++i) {
        const unsigned m = m0 + frag_index<BM, TM>(tm, i);
        if (m >= M) continue;
        float* __restrict__ row = dest + (size_t)m * N;
        if constexpr (TN % 4 == 0 && N % 4 == 0) {
#pragma unroll
            for (unsigned g = 0; g < TN / 4; ++g) {
                const unsigned n = n0 + frag_index<BN, TN>(tn, 4 * g);
                if (n < N) {
                    *reinterpret_cast<float4*>(row + n) =
                        make_float4(acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]);
                }
            }
        } else {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                const unsigned n = n0 + frag_index<BN, TN>(tn, j);
                if (n < N) row[n] = acc[i][j];
            }
        }
    }
}

// Second pass of a split stage: dest[i] = partial[0][i] + partial[1][i] + ..., in that order, over
// `images` outputs of COUNT elements each (partial: [SPLIT][images][COUNT]).
template <unsigned long long COUNT, unsigned SPLIT>
__device__ __forceinline__ void split_sum(const float* __restrict__ partial, float* __restrict__ dest,
                                          unsigned images)
{
    const size_t i = (size_t)blockIdx.x * BLOCK + threadIdx.x;
    const size_t count = COUNT * images;
    if constexpr (COUNT % 4 == 0) {
        if (i >= count / 4) return;
        float4 sum = __ldg(reinterpret_cast<const float4*>(partial) + i);
#pragma unroll 4
        for (unsigned s = 1; s < SPLIT; ++s) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(partial + s * count) + i);
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        }
        reinterpret_cast<float4*>(dest)[i] = sum;
    } else {
        if (i >= count) return;
        float sum = __ldg(partial + i);
#pragma unroll 4
        for (unsigned s = 1; s < SPLIT; ++s) {
            sum += __ldg(partial + s * count + i);
        }
        dest[i] = sum;
    }
}
