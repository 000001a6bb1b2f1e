// What convgen's generated kernels use of CUDA, for the host C++ compiler: tests/emulated_cupy.py puts this before
// every source it builds. Thread and block indices, shared memory, barriers, warp shuffles, vector types, bit casts,
// and the tensor cores' fragments (mma.sync and warpgroup mma) from the PTX ISA's layouts; a launch runs a block's
// threads as OS threads.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
#include <math.h>

struct emulated_index { unsigned x, y, z; };
inline thread_local emulated_index threadIdx, blockIdx;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) double2 { double x, y; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline double2 make_double2(double x, double y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
template <class T> inline T __ldg(const T* p) { return *p; }
// Byte i of the result is byte (s >> 4 i) & 7 of y:x (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    const unsigned long long both = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (unsigned i = 0; i < 4; ++i) r |= (unsigned)(both >> 8 * (s >> 4 * i & 7) & 0xFF) << 8 * i;
    return r;
}
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }  // CUDA's integer min
template <class To, class From> inline To emulated_bits(From value)
{
    To out;
    std::memcpy(&out, &value, sizeof out);
    return out;
}
inline float __int_as_float(int v) { return emulated_bits<float>(v); }
inline float __uint_as_float(unsigned v) { return emulated_bits<float>(v); }
inline unsigned __float_as_uint(float v) { return emulated_bits<unsigned>(v); }
inline int __float_as_int(float v) { return emulated_bits<int>(v); }
inline double __longlong_as_double(long long v) { return emulated_bits<double>(v); }
inline long long __double_as_longlong(double v) { return emulated_bits<long long>(v); }

// The running block's barrier (one block at a time), the word __syncthreads_or reduces into, and per warp
// a barrier and a slot per lane for the warp intrinsics. A thread that leaves the kernel drops out of the
// barriers, as a CUDA thread that has exited no longer holds __syncthreads up.
struct emulated_warp {
    std::unique_ptr<std::barrier<>> barrier;
    unsigned long long lanes[32];
    unsigned a[32][4], b[32][2];  // mma_tf32's fragments, by lane
};
struct emulated_warpgroup {  // four warps: a wgmma's A fragments, by thread
    std::unique_ptr<std::barrier<>> barrier;
    unsigned a[128][4];
};
struct emulated_block {
    std::unique_ptr<std::barrier<>> barrier;
    std::atomic<int> any{0};
    std::vector<emulated_warp> warps;
    std::vector<emulated_warpgroup> warpgroups;
    std::vector<float4> dynamic;  // the launch's dynamic shared memory, 16-byte aligned, all-ones bytes
    unsigned dynamic_bytes = 0;
};
inline emulated_block* emulated_current;
inline unsigned char* dynamic_shared() { return reinterpret_cast<unsigned char*>(emulated_current->dynamic.data()); }
inline unsigned dynamic_shared_bytes() { return emulated_current->dynamic_bytes; }
[[noreturn]] inline void __trap()
{
    std::fputs("emulated kernel: __trap()\n", stderr);
    std::abort();
}
inline void __syncthreads() { emulated_current->barrier->arrive_and_wait(); }
inline void __syncwarp() { emulated_current->warps[threadIdx.x / 32].barrier->arrive_and_wait(); }
inline int __syncthreads_or(int predicate)
{
    emulated_block& block = *emulated_current;
    block.barrier->arrive_and_wait();  // every thread is past the last reading of `any`
    if (predicate) block.any.fetch_or(1);
    block.barrier->arrive_and_wait();
    const int result = block.any.load();
    block.barrier->arrive_and_wait();
    if (threadIdx.x == 0) block.any.store(0);
    block.barrier->arrive_and_wait();
    return result;
}
// Every lane of the warp publishes `value`, then each reads what `read(lane)` names (the mask is taken to be
// the whole warp, as the kernels pass it).
template <class T, class Read> inline T emulated_exchange(T value, Read read)
{
    emulated_warp& warp = emulated_current->warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x % 32;
    unsigned long long slot = 0;
    std::memcpy(&slot, &value, sizeof value);
    warp.lanes[lane] = slot;
    warp.barrier->arrive_and_wait();
    const T result = read(warp.lanes, lane);
    warp.barrier->arrive_and_wait();
    return result;
}
inline unsigned __ballot_sync(unsigned, int predicate)
{
    return emulated_exchange<unsigned>(predicate ? 1u : 0u, [](const unsigned long long* lanes, unsigned) {
        unsigned bits = 0;
        for (unsigned i = 0; i < 32; ++i) bits |= (lanes[i] & 1u) << i;
        return bits;
    });
}
template <class T> inline T __shfl_sync(unsigned, T value, unsigned source_lane)
{
    return emulated_exchange<T>(value, [&](const unsigned long long* lanes, unsigned) {
        T out;
        std::memcpy(&out, &lanes[source_lane % 32], sizeof out);
        return out;
    });
}
template <class T> inline T __shfl_down_sync(unsigned, T value, unsigned offset)
{
    return emulated_exchange<T>(value, [&](const unsigned long long* lanes, unsigned lane) {
        T out = value;
        if (lane + offset < 32) std::memcpy(&out, &lanes[lane + offset], sizeof out);
        return out;
    });
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 for the warp, from the PTX ISA's fragment layouts
// (g = lane / 4, t = lane % 4): A (16 x 8) a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); B
// (8 x 8) b0 (t, g), b1 (t + 4, g); C and D (16 x 8) c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t),
// c3 (g + 8, 2t + 1). An operand is read as TF32: its low 13 bits are ignored. Products are exact and
// summed in double, then added to c once: at least as accurate as the hardware, which sums in float.
// CONVGEN_EMULATED tells the sources to leave out their inline PTX (mma.cuh, common.cuh's cvt).
#define CONVGEN_EMULATED
inline void mma_tf32(float& c0, float& c1, float& c2, float& c3, const unsigned (&a)[4], const unsigned (&b)[2])
{
    emulated_warp& warp = emulated_current->warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x % 32;
    for (unsigned i = 0; i < 4; ++i) warp.a[lane][i] = a[i];
    for (unsigned i = 0; i < 2; ++i) warp.b[lane][i] = b[i];
    warp.barrier->arrive_and_wait();
    double A[16][8], B[8][8];
    const auto tf32 = [](unsigned bits) { return (double)emulated_bits<float>(bits & 0xffffe000u); };
    for (unsigned l = 0; l < 32; ++l) {
        const unsigned g = l / 4, t = l % 4;
        A[g][t] = tf32(warp.a[l][0]), A[g + 8][t] = tf32(warp.a[l][1]);
        A[g][t + 4] = tf32(warp.a[l][2]), A[g + 8][t + 4] = tf32(warp.a[l][3]);
        B[t][g] = tf32(warp.b[l][0]), B[t + 4][g] = tf32(warp.b[l][1]);
    }
    warp.barrier->arrive_and_wait();  // every lane has read the fragments before any publishes again
    const unsigned g = lane / 4, t = lane % 4;
    const auto dot = [&](unsigned row, unsigned col) {
        double sum = 0;
        for (unsigned k = 0; k < 8; ++k) sum += A[row][k] * B[k][col];
        return sum;
    };
    c0 = (float)(c0 + dot(g, 2 * t)), c1 = (float)(c1 + dot(g, 2 * t + 1));
    c2 = (float)(c2 + dot(g + 8, 2 * t)), c3 = (float)(c3 + dot(g + 8, 2 * t + 1));
}

// cvt.rn.tf32.f32: to 10 mantissa bits, ties to even; inf and NaN as they are, overflow to inf.
inline unsigned emulated_rounded_tf32(float x)
{
    const unsigned bits = emulated_bits<unsigned>(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;
    return (bits + 0xfffu + (bits >> 13 & 1u)) & 0xffffe000u;
}
// cvt.rna.tf32.f32: ties away from zero; inf and NaN as they are, overflow to inf.
inline unsigned emulated_rna_tf32(float x)
{
    const unsigned bits = emulated_bits<unsigned>(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;
    return (bits + 0x1000u) & 0xffffe000u;
}

// Hopper's warpgroup mma for the `_wgmma` kernels, whose own helpers are inline PTX. Shared addresses count from
// the dynamic shared memory's start, which is as aligned as the 128-byte swizzle needs.
#define __CUDA_ARCH_FEAT_SM90_ALL
inline size_t __cvta_generic_to_shared(const void* p)
{
    return static_cast<size_t>(static_cast<const unsigned char*>(p) - dynamic_shared());
}
inline void fence_async_shared() {}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <unsigned N> inline void wgmma_wait() {}  // the products below are done when the call returns
template <unsigned R> inline void fence_accumulators(float (&)[R]) {}
// The `bytes` bits at byte `offset` of row n of an operand (B's, or 16-bit A's) through its wgmma descriptor:
// K-major rows of 128 bytes (layout 1) or 64 (layout 2) from its start, 8-row groups its stride byte offset
// apart, a value's address bits 4-6 (4-5) XORed with bits 7-9 (7-8): the 128-byte (64-byte) swizzle. MN-major
// (a 16-bit A with trans-a 1, the 128-byte swizzle): rows of 128 bytes are k, each holding 64 consecutive values
// of M, 8-k groups the stride byte offset apart (the PTX ISA's canonical MN-major layout, one atom along M). Any
// other layout or stride stops the process.
inline unsigned emulated_operand_bits(unsigned long long b, unsigned n, unsigned offset, unsigned bytes,
                                      bool mn_major = false)
{
    const unsigned start = static_cast<unsigned>(b & 0x3FFF) << 4, stride = static_cast<unsigned>(b >> 32 & 0x3FFF) << 4;
    const unsigned layout = static_cast<unsigned>(b >> 62), row_bytes = layout == 1 ? 128 : layout == 2 ? 64 : 0;
    if (row_bytes == 0 || stride != 8 * row_bytes || mn_major && (row_bytes != 128 || bytes != 2 || n >= 64)) {
        std::fprintf(stderr, "emulated wgmma: descriptor layout %u, stride byte offset %u\n", layout, stride);
        std::abort();
    }
    const unsigned k = offset / bytes;
    const unsigned address = mn_major ? start + stride * (k / 8) + row_bytes * (k % 8) + bytes * n
                                      : start + stride * (n / 8) + row_bytes * (n % 8) + offset;
    unsigned bits = 0;
    std::memcpy(&bits, dynamic_shared() + (address ^ (address >> 7 & (row_bytes / 16 - 1)) << 4), bytes);
    return bits;
}
// d += A B for the warpgroup, B N x K (N = 2R) through its descriptor, each value `bytes` wide and decoded by
// `value`; D rows g and g + 8 of the warp's 16 (r % 4 >= 2: g + 8), column 8 (r / 4) + 2 t + r % 2. Products
// summed in double, added once.
template <unsigned K, unsigned R, class Value>
inline void emulated_wgmma(float (&d)[R], const double (&rows)[2][K], unsigned long long b, unsigned bytes, Value value)
{
    const unsigned t = threadIdx.x % 4;
    for (unsigned r = 0; r < R; ++r) {
        const unsigned column = r / 4 * 8 + 2 * t + r % 2;
        double sum = 0;
        for (unsigned k = 0; k < K; ++k) {
            sum += rows[r % 4 >= 2][k] * value(emulated_operand_bits(b, column, bytes * k, bytes));
        }
        d[r] = (float)(d[r] + sum);
    }
}
// wgmma.mma_async.m64n{2R}k8.f32.tf32.tf32: A 64 x 8 from registers, warp w's rows 16 w .. 16 w + 15 as
// mma.sync's m16n8k8 A fragment; operands read as TF32 (their low 13 bits ignored).
template <unsigned R> inline void wgmma_tf32(float (&d)[R], const unsigned (&a)[4], unsigned long long b)
{
    emulated_warpgroup& group = emulated_current->warpgroups[threadIdx.x / 128];
    const unsigned thread = threadIdx.x % 128, warp = thread / 32, g = thread % 32 / 4;
    for (unsigned i = 0; i < 4; ++i) group.a[thread][i] = a[i];
    group.barrier->arrive_and_wait();
    const auto tf32 = [](unsigned bits) { return (double)emulated_bits<float>(bits & 0xffffe000u); };
    double rows[2][8];  // this thread's rows g and g + 8, from the four lanes of the warp that hold them
    for (unsigned lane_t = 0; lane_t < 4; ++lane_t) {
        const unsigned (&f)[4] = group.a[warp * 32 + 4 * g + lane_t];
        rows[0][lane_t] = tf32(f[0]), rows[1][lane_t] = tf32(f[1]);
        rows[0][lane_t + 4] = tf32(f[2]), rows[1][lane_t + 4] = tf32(f[3]);
    }
    group.barrier->arrive_and_wait();  // every thread has read the fragments before any publishes again
    emulated_wgmma(d, rows, b, 4, tf32);
}

// cp.async copies at once (a copy lands before the thread goes on, which the real one may also do), so
// committing and waiting have nothing left to do; an invalid copy writes zeros and reads nothing.
inline void copy_async(void* destination, const void* source, bool valid)
{
    if (valid) std::memcpy(destination, source, 4);
    else std::memset(destination, 0, 4);
}
inline void copy_async16(void* destination, const void* source, bool valid)
{
    if (valid) std::memcpy(destination, source, 16);
    else std::memset(destination, 0, 16);
}
inline void commit_copies() {}
template <unsigned N> inline void wait_copies() {}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} likewise: the 16-bit halves of each register decoded
// here on their own (bfloat16: the top half of a float; float16: by its fields), products in double.
inline double emulated_half(unsigned bits)
{
#if ELEMENT_BF16
    return emulated_bits<float>(bits << 16);
#else
    const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
    const double sign = bits & 0x8000 ? -1.0 : 1.0;
    if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
    return sign * (exponent ? std::ldexp(1024 + mantissa, exponent - 25) : std::ldexp(mantissa, -24));
#endif
}
inline void mma_16bit(float& c0, float& c1, float& c2, float& c3, const unsigned (&a)[4], const unsigned (&b)[2])
{
    emulated_warp& warp = emulated_current->warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x % 32;
    for (unsigned i = 0; i < 4; ++i) warp.a[lane][i] = a[i];
    for (unsigned i = 0; i < 2; ++i) warp.b[lane][i] = b[i];
    warp.barrier->arrive_and_wait();
    double A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; ++l) {
        const unsigned g = l / 4, t = l % 4;
        for (unsigned h = 0; h < 2; ++h) {
            const auto half = [&](unsigned word) { return emulated_half(word >> (16 * h) & 0xffffu); };
            A[g][2 * t + h] = half(warp.a[l][0]), A[g + 8][2 * t + h] = half(warp.a[l][1]);
            A[g][2 * t + 8 + h] = half(warp.a[l][2]), A[g + 8][2 * t + 8 + h] = half(warp.a[l][3]);
            B[2 * t + h][g] = half(warp.b[l][0]), B[2 * t + 8 + h][g] = half(warp.b[l][1]);
        }
    }
    warp.barrier->arrive_and_wait();  // every lane has read the fragments before any publishes again
    const unsigned g = lane / 4, t = lane % 4;
    const auto dot = [&](unsigned row, unsigned col) {
        double sum = 0;
        for (unsigned k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
        return sum;
    };
    c0 = (float)(c0 + dot(g, 2 * t)), c1 = (float)(c1 + dot(g, 2 * t + 1));
    c2 = (float)(c2 + dot(g + 8, 2 * t)), c3 = (float)(c3 + dot(g + 8, 2 * t + 1));
}

// wgmma.mma_async.m64n{2R}k16.f32.{bf16,f16} with A from shared memory too: this thread's rows g and g + 8 of its
// warp's 16 read through A's descriptor, K-major as B's rows are or with A_MN_MAJOR (trans-a 1) MN-major, the
// 16-bit values decoded by emulated_half.
template <unsigned A_MN_MAJOR = 0, unsigned R>
inline void wgmma_16bit(float (&d)[R], unsigned long long a, unsigned long long b)
{
    const unsigned row = threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4;
    double rows[2][16];
    for (unsigned h = 0; h < 2; ++h) {
        for (unsigned k = 0; k < 16; ++k) {
            rows[h][k] = emulated_half(emulated_operand_bits(a, row + 8 * h, 2 * k, 2, A_MN_MAJOR != 0));
        }
    }
    emulated_wgmma(d, rows, b, 2, emulated_half);
}

template <class Body> void emulated_launch(unsigned grid, unsigned threads, unsigned shared_bytes, Body body)
{
    std::barrier<> between(threads);
    emulated_block block;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            for (unsigned b = 0; b < grid; ++b) {
                between.arrive_and_wait();  // the last block is done with its shared memory
                if (t == 0) {
                    block.barrier = std::make_unique<std::barrier<>>(threads);
                    block.warps = std::vector<emulated_warp>((threads + 31) / 32);
                    for (unsigned w = 0; w < block.warps.size(); ++w) {
                        const unsigned lanes = threads - 32 * w < 32 ? threads - 32 * w : 32;
                        block.warps[w].barrier = std::make_unique<std::barrier<>>(lanes);
                    }
                    block.warpgroups = std::vector<emulated_warpgroup>((threads + 127) / 128);
                    for (unsigned w = 0; w < block.warpgroups.size(); ++w) {
                        const unsigned members = threads - 128 * w < 128 ? threads - 128 * w : 128;
                        block.warpgroups[w].barrier = std::make_unique<std::barrier<>>(members);
                    }
                    block.dynamic.assign((shared_bytes + 15) / 16, float4{});
                    std::memset(block.dynamic.data(), 0xff, block.dynamic.size() * sizeof(float4));
                    block.dynamic_bytes = shared_bytes;
                    emulated_current = &block;
                }
                between.arrive_and_wait();
                blockIdx = {b, 0, 0};
                body();
                block.barrier->arrive_and_drop();
                block.warps[t / 32].barrier->arrive_and_drop();
                block.warpgroups[t / 128].barrier->arrive_and_drop();
            }
        });
    }
    for (std::thread& thread : pool) thread.join();
}
