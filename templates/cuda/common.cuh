// The element type of every array: float, or double with ELEMENT_BYTES 8 (the tape's dtype).
#if ELEMENT_BYTES == 8
typedef double real;
#else
typedef float real;
#endif

// +inf of the element type (NVRTC has no <limits>).
__device__ __forceinline__ real positive_infinity()
{
    if constexpr (sizeof(real) == 8) {
        return __longlong_as_double(0x7ff0000000000000ll);
    } else {
        return __int_as_float(0x7f800000);
    }
}

// A divisor for decomposing a flat index; an empty axis launches no thread, but the code that
// would divide by it is still compiled.
__device__ __forceinline__ constexpr unsigned nonzero(unsigned long long n) { return n ? (unsigned)n : 1u; }
