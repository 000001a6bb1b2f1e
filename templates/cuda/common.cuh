// A divisor for decomposing a flat index; an empty axis launches no thread, but the code that
// would divide by it is still compiled.
__device__ __forceinline__ constexpr unsigned nonzero(unsigned long long n) { return n ? (unsigned)n : 1u; }
