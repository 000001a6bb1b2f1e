#!/usr/bin/env python3
"""A probe of Hopper's wgmma on the GPU (sm_90a, through CuPy) for the shifted-window kernels that NOTES.md plans:
does wgmma read a 128-byte-swizzled operand whose start lies 128*s bytes into a 1024-byte swizzle atom with the
descriptor's base-offset field 0, or does it need base offset s? Both operand forms such kernels would shift: A
MN-major (trans-a 1: rows are k, 64 values of M each; the weight gradient's U shifted by s cells) and A K-major (rows
are m, 64 values of k each; the forward's input shifted by s cells). The buffer holds 72 rows of 128 bytes (64 bf16),
chunk c of row r at chunk c ^ (r % 8) (the address bits of a 1024-aligned buffer); B is the identity (B[k][n] = 1
where k == n), so D[m][n] is A[m][n]: MN-major A[m][k] = S[k + s][m], K-major A[m][k] = S[m + s][k]. Prints, per
form and base offset, whether each shift s = 0..7 reads exactly that.

    python benchmarks/wgmma_shift_probe.py
"""

from __future__ import annotations

import sys

import numpy as np

SOURCE = r'''
__device__ unsigned long long descriptor(unsigned address, unsigned base_offset)
{
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32)
           | ((unsigned long long)(base_offset & 7) << 49) | (1ull << 62);
}
template <int TRANS_A>
__device__ void product(float (&d)[4], unsigned long long a, unsigned long long b)
{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, %6, 0;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b), "n"(TRANS_A));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int r = 0; r < 4; ++r) asm volatile("" : "+f"(d[r])::"memory");
}
extern "C" __global__ void probe(const unsigned short* rows, float* out)
{
    __shared__ __align__(1024) unsigned char smem[72 * 128 + 1024];
    unsigned char* const s_rows = smem;
    unsigned char* const s_b = smem + 72 * 128;
    const unsigned tid = threadIdx.x;
    for (unsigned i = tid; i < 72 * 8; i += 128) {  // 16-byte chunk c of row r
        const unsigned r = i / 8, c = i % 8;
        *reinterpret_cast<uint4*>(s_rows + r * 128 + 16 * (c ^ (r % 8))) = reinterpret_cast<const uint4*>(rows)[i];
    }
    for (unsigned i = tid; i < 8 * 64; i += 128) {  // B K-major: row n, element k (only k < 16 read)
        const unsigned n = i / 64, k = i % 64, c = k / 8;
        reinterpret_cast<unsigned short*>(s_b + n * 128 + 16 * (c ^ (n % 8)))[k % 8] = k == n ? 0x3F80 : 0;
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned a0 = (unsigned)__cvta_generic_to_shared(s_rows), b0 = (unsigned)__cvta_generic_to_shared(s_b);
    const unsigned warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
    for (unsigned form = 0; form < 2; ++form) {
        for (unsigned base = 0; base < 2; ++base) {
            for (unsigned s = 0; s < 8; ++s) {
                float d[4] = {0.f, 0.f, 0.f, 0.f};
                const unsigned long long a = descriptor(a0 + 128 * s, base ? s : 0), b = descriptor(b0, 0);
                if (form == 0) product<1>(d, a, b); else product<0>(d, a, b);
                float* const o = out + ((form * 2 + base) * 8 + s) * 64 * 8;
                for (unsigned r = 0; r < 4; ++r) o[(warp * 16 + g + (r >= 2 ? 8 : 0)) * 8 + 2 * t + r % 2] = d[r];
            }
        }
    }
}
'''


def main() -> int:
    import cupy

    rng = np.random.default_rng(1)
    values = rng.integers(-100, 100, (72, 64)).astype(np.float32)  # exact in bf16
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    kernel = cupy.RawModule(code=SOURCE, options=("-arch=sm_90a", "--std=c++17")).get_function("probe")
    out = cupy.zeros((2, 2, 8, 64, 8), cupy.float32)
    kernel((1,), (128,), (cupy.asarray(bits), out))
    got = cupy.asnumpy(out)
    for form, name in enumerate(("MN-major A (trans-a 1)", "K-major A (trans-a 0)")):
        for base in (0, 1):
            exact = [bool(np.array_equal(got[form, base, s], values[s:s + 8, :].T if form == 0 else
                                         values[s:s + 64, :8])) for s in range(8)]
            print(f"{name}, base offset {'s' if base else '0'}: shifts 0..7 exact: {exact}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
