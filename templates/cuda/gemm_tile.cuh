// Thread tiles and memory access of the implicit-GEMM kernels (conv families), inlined into each
// generated source by `convgen build` before gemm.cuh. Needs BLOCK (a define), `real`, the element
// type, and `scalar`, the compute type (common.cuh): shared memory, registers and the partial
// buffers of split stages hold scalars; only the operands and results are `real`.

// Greatest common divisor, for the stride phases of a dilated gather (compile-time constants).
__device__ __forceinline__ constexpr unsigned gcd_of(unsigned a, unsigned b) { return b ? gcd_of(b, a % b) : a; }

// Sum of N per-thread values over the block, in a fixed order (no atomics): a shuffle tree inside
// each warp, then thread 0 adds the warps in order. Every thread of the block must call it.
template <int N>
__device__ __forceinline__ void block_sum(scalar (&acc)[N])
{
    constexpr unsigned WARPS = (BLOCK + 31) / 32;
    __shared__ scalar per_warp[WARPS][N];
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

// Who owns what of the block tile, per MODE (the MMA_MODE define). FMAs (0): thread (tm, tn) of the
// (BM / TM) x (BN / TN) thread grid owns rows frag_index<BM, TM>(tm, i) and columns frag_index<BN, TN>(tn, j).
// Tensor cores (1, 3): warp (tm, tn) of the (BM / 8TM) x (BN / 4TN) warp grid owns an 8TM x 4TN warp tile
// of (TM / 2) x (TN / 2) mma tiles of 16 x 8; accumulator (i, j) of a lane is element 2 (i % 2) + j % 2
// of the C fragment of mma tile (i / 2, j / 2): row 8 (i % 2) + lane / 4, column 2 (lane % 4) + j % 2
// (PTX ISA, mma.m16n8k8 C/D fragments). Either way a thread holds TM x TN accumulators and the block
// has (BM / TM) * (BN / TN) threads.
template <unsigned MODE, unsigned BN, unsigned TN>
__device__ __forceinline__ void tile_owner(unsigned tid, unsigned& tm, unsigned& tn)
{
    constexpr unsigned ACROSS = MODE == 0 ? BN / TN : BN / (4 * TN);  // threads or warps along a row
    const unsigned owner = MODE == 0 ? tid : tid / 32;
    tm = owner / ACROSS, tn = owner % ACROSS;
}
template <unsigned MODE, unsigned BM, unsigned TM>
__device__ __forceinline__ unsigned tile_row(unsigned tm, unsigned i)
{
    if constexpr (MODE == 0) {
        return frag_index<BM, TM>(tm, i);
    } else {
        return tm * 8 * TM + i / 2 * 16 + i % 2 * 8 + threadIdx.x % 32 / 4;
    }
}
template <unsigned MODE, unsigned BN, unsigned TN>
__device__ __forceinline__ unsigned tile_col(unsigned tn, unsigned j)
{
    if constexpr (MODE == 0) {
        return frag_index<BN, TN>(tn, j);
    } else {
        return tn * 4 * TN + j / 2 * 8 + threadIdx.x % 4 * 2 + j % 2;
    }
}

// Four consecutive elements at a 16-byte aligned address: one 16-byte access for float, two for
// double. The __ldg variants read global memory through the read-only cache.
__device__ __forceinline__ void load4(const float* p, float& a, float& b, float& c, float& d)
{
    const float4 q = *reinterpret_cast<const float4*>(p);
    a = q.x, b = q.y, c = q.z, d = q.w;
}
__device__ __forceinline__ void load4(const double* p, double& a, double& b, double& c, double& d)
{
    const double2 q = reinterpret_cast<const double2*>(p)[0], r = reinterpret_cast<const double2*>(p)[1];
    a = q.x, b = q.y, c = r.x, d = r.y;
}
// Elements 4i .. 4i + 3 of p.
__device__ __forceinline__ void ldg4(const float* p, size_t i, float (&v)[4])
{
    const float4 q = __ldg(reinterpret_cast<const float4*>(p) + i);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ __forceinline__ void ldg4(const double* p, size_t i, double (&v)[4])
{
    const double2 q = __ldg(reinterpret_cast<const double2*>(p) + 2 * i);
    const double2 r = __ldg(reinterpret_cast<const double2*>(p) + 2 * i + 1);
    v[0] = q.x, v[1] = q.y, v[2] = r.x, v[3] = r.y;
}
__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d)
{
    *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(double* p, double a, double b, double c, double d)
{
    reinterpret_cast<double2*>(p)[0] = make_double2(a, b);
    reinterpret_cast<double2*>(p)[1] = make_double2(c, d);
}

#if ELEMENT_BYTES == 2
// The same for 16-bit elements in global memory: four in one 8-byte access (8-byte aligned), loaded as
// they are stored (staging widens them later: staged_value) or narrowed from scalars.
__device__ __forceinline__ void ldg4(const real* p, size_t i, real (&v)[4])
{
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(p) + i);
    v[0] = real{(unsigned short)q.x}, v[1] = real{(unsigned short)(q.x >> 16)};
    v[2] = real{(unsigned short)q.y}, v[3] = real{(unsigned short)(q.y >> 16)};
}
// Eight 16-bit elements at a 16-byte aligned address, in one access.
__device__ __forceinline__ void ldg8(const real* p, real (&v)[8])
{
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
    const unsigned words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (unsigned i = 0; i < 4; ++i) {
        v[2 * i] = real{(unsigned short)words[i]}, v[2 * i + 1] = real{(unsigned short)(words[i] >> 16)};
    }
}
// Two elements in one word, `low` in its low half (the order of consecutive k in an mma fragment register).
__device__ __forceinline__ unsigned element_pair(real low, real high) { return low.bits | (unsigned)high.bits << 16; }
__device__ __forceinline__ unsigned narrowed_pair(scalar a, scalar b) { return element_pair(narrowed(a), narrowed(b)); }
__device__ __forceinline__ void store4(real* p, scalar a, scalar b, scalar c, scalar d)
{
    *reinterpret_cast<uint2*>(p) = make_uint2(narrowed_pair(a, b), narrowed_pair(c, d));
}
__device__ __forceinline__ void store2(real* p, scalar a, scalar b)
{
    *reinterpret_cast<unsigned*>(p) = narrowed_pair(a, b);
}
// One result to global memory: a split stage's partial buffer keeps the scalar.
__device__ __forceinline__ void put(real* p, scalar x) { *p = narrowed(x); }
// A finite value narrowed, in one cvt where the GPU has it (sm_80 on): for finite values it rounds to nearest even
// as narrowed does, overflowing to inf alike; only the NaN they make differs.
__device__ __forceinline__ real narrowed_finite(scalar x)
{
#if !defined(CONVGEN_EMULATED) && __CUDA_ARCH__ >= 800
    unsigned short bits;
#if ELEMENT_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(x));
#endif
    return real{bits};
#else
    return narrowed(x);
#endif
}
#else
__device__ __forceinline__ real narrowed_finite(scalar x) { return x; }
#endif
// Two consecutive elements at an aligned address (float: one 8-byte access), and one element.
__device__ __forceinline__ void store2(float* p, float a, float b)
{
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store2(double* p, double a, double b)
{
    *reinterpret_cast<double2*>(p) = make_double2(a, b);
}
__device__ __forceinline__ void put(scalar* p, scalar x) { *p = x; }

// The array a GEMM kernel writes: its output of `real`s, or with SPLIT > 1 the partial buffer
// [SPLIT][...] of scalars that the runtime passes in the output's place (16-bit elements keep their
// partial sums in float until the reduce kernel adds them up).
template <bool PARTIAL> struct gemm_output { typedef real type; };
template <> struct gemm_output<true> { typedef scalar type; };

template <unsigned B, unsigned T>
__device__ __forceinline__ void load_fragment(const scalar* row, unsigned t, scalar (&v)[T])
{
    if constexpr (T % 4 == 0) {
#pragma unroll
        for (unsigned g = 0; g < T / 4; ++g) {
            load4(row + frag_index<B, T>(t, 4 * g), v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]);
        }
    } else {
#pragma unroll
        for (unsigned i = 0; i < T; ++i) {
            v[i] = row[frag_index<B, T>(t, i)];
        }
    }
}

// A thread's T values of staged row kk at its tile positions (tile_row / tile_col): the FMA fragment,
// or in tensor-core mode the scalar elements of its C fragment positions.
template <unsigned MODE, unsigned B, unsigned T, bool ROWS, unsigned K, unsigned W>
__device__ __forceinline__ void load_tile_values(const scalar (&tile)[K][W], unsigned kk, unsigned t, scalar (&v)[T])
{
    if constexpr (MODE == 0) {
        load_fragment<B, T>(tile[kk], t, v);
    } else {
#pragma unroll
        for (unsigned i = 0; i < T; ++i) {
            v[i] = tile[kk][ROWS ? tile_row<MODE, B, T>(t, i) : tile_col<MODE, B, T>(t, i)];
        }
    }
}
template <unsigned MODE, unsigned B, unsigned T, bool ROWS, unsigned K, unsigned W>
__device__ __forceinline__ void load_tile_values(const unsigned (&tile)[K][W], unsigned kk, unsigned t,
                                                 scalar (&v)[T])
{
#pragma unroll
    for (unsigned i = 0; i < T; ++i) {
        const unsigned w = ROWS ? tile_row<MODE, B, T>(t, i) : tile_col<MODE, B, T>(t, i);
        v[i] = widened(reinterpret_cast<const real*>(&tile[kk / 2][w])[kk % 2]);
    }
}

// a * b + c rounded once, in the element type.
__device__ __forceinline__ float fused_multiply_add(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fused_multiply_add(double a, double b, double c) { return fma(a, b, c); }
