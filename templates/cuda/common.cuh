// The element type `real` of the arrays in global memory, and `scalar`, the type the kernels
// compute in: float (ELEMENT_BYTES 4) and double (8) compute in themselves; the 16-bit types
// (ELEMENT_BYTES 2: bfloat16 with ELEMENT_BF16 1, else float16) are read into float, summed in float
// and rounded to 16 bits once, when a result is stored. Loads of `real` go through load_element and
// stores through narrowed, so the same kernel text serves every element type.
#if ELEMENT_BYTES == 8
typedef double real;
typedef double scalar;
#elif ELEMENT_BYTES == 4
typedef float real;
typedef float scalar;
#else
struct real {
    unsigned short bits;  // the 16-bit pattern; no arithmetic happens on it
};
typedef float scalar;
#endif

#if ELEMENT_BYTES == 2
// The conversions are integer arithmetic that g++ runs too (the CPU emulation of the kernels), and
// they happen only where an element is loaded or a result stored.
#if ELEMENT_BF16
// bfloat16 is the top half of a float: widening is exact; narrowing rounds to nearest even, and a
// NaN stays a NaN (a quiet one) rather than rounding into the infinities.
__device__ __forceinline__ scalar widened(real x) { return __uint_as_float((unsigned)x.bits << 16); }
__device__ __forceinline__ real narrowed(scalar x)
{
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return real{(unsigned short)(u >> 16 | 0x40u)};
    return real{(unsigned short)((u + 0x7fffu + (u >> 16 & 1u)) >> 16)};
}
#else
// float16: 5 exponent bits, 10 mantissa bits. Widening is one cvt on the GPU (the staging of the TF32
// path widens every element: with the integer form conv4d's fp16 forward ran 65% over bf16's); the CPU
// emulation moves the exponent and mantissa into a float and rescales by 2^112, which renormalises the
// subnormals exactly, inf and NaN keeping all ones.
__device__ __forceinline__ scalar widened(real x)
{
#ifndef CONVGEN_EMULATED
    float wide;
    asm("cvt.f32.f16 %0, %1;" : "=f"(wide) : "h"(x.bits));
    return wide;
#else
    const unsigned h = x.bits, sign = (h & 0x8000u) << 16;
    const float magnitude = (h & 0x7c00u) == 0x7c00u ? __uint_as_float(0x7f800000u | (h & 0x3ffu) << 13)
                                                      : __uint_as_float((h & 0x7fffu) << 13) * 0x1p112f;
    return __uint_as_float(sign | __float_as_uint(magnitude));
#endif
}
// Round to nearest even: values from 65520 on become inf, NaN a quiet NaN; below 2^-14 a float add of
// 0.5 aligns the subnormal's 10 bits at the bottom and rounds them (the float adder's own rounding).
__device__ __forceinline__ real narrowed(scalar x)
{
    unsigned u = __float_as_uint(x);
    const unsigned sign = u >> 16 & 0x8000u;
    u &= 0x7fffffffu;
    unsigned short bits;
    if (u >= 0x47800000u) {  // 65536 or more: inf, or NaN
        bits = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (u < 0x38800000u) {  // below 2^-14: subnormal or zero
        bits = (unsigned short)(__float_as_uint(__uint_as_float(u) + 0.5f) - 0x3f000000u);
    } else {
        bits = (unsigned short)((u + 0xc8000fffu + (u >> 13 & 1u)) >> 13);  // rebias by -112 << 23, round
    }
    return real{(unsigned short)(bits | sign)};
}
#endif
__device__ __forceinline__ real load_stored(const real* p)
{
    return real{__ldg(reinterpret_cast<const unsigned short*>(p))};
}
#else
__device__ __forceinline__ scalar widened(real x) { return x; }
__device__ __forceinline__ real narrowed(scalar x) { return x; }
__device__ __forceinline__ real load_stored(const real* p) { return __ldg(p); }
#endif

// An element of global memory through the read-only cache, as the kernels compute with it.
__device__ __forceinline__ scalar load_element(const real* p) { return widened(load_stored(p)); }

// +inf of the compute type (NVRTC has no <limits>).
__device__ __forceinline__ scalar positive_infinity()
{
    if constexpr (sizeof(scalar) == 8) {
        return __longlong_as_double(0x7ff0000000000000ll);
    } else {
        return __int_as_float(0x7f800000);
    }
}

// A divisor for decomposing a flat index; an empty axis launches no thread, but the code that
// would divide by it is still compiled.
__device__ __forceinline__ constexpr unsigned nonzero(unsigned long long n) { return n ? (unsigned)n : 1u; }
