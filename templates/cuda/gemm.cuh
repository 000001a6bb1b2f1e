// Staged slices of the implicit-GEMM kernels (conv families), inlined after gemm_tile.cuh: their
// products on FMAs or tensor cores, the staging, the rare path, the stores and the split sums. Needs
// BLOCK, and SHARED_ROW_PAD, SHARED_BUFFERS, STATIC_SHARED_BYTES and SPLIT_SUM_QUAD_COUNT (from the contract).

// One staged slice: acc += As^T Bs over its BK rows (shared rows padded by SHARED_ROW_PAD elements).
template <unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN>
__device__ __forceinline__ void slice_fma(const scalar (&As)[BK][BM + SHARED_ROW_PAD],
                                          const scalar (&Bs)[BK][BN + SHARED_ROW_PAD], unsigned tm, unsigned tn,
                                          scalar (&acc)[TM][TN])
{
#pragma unroll
    for (unsigned kk = 0; kk < BK; ++kk) {
        scalar a[TM], b[TN];
        load_fragment<BM, TM>(As[kk], tm, a);
        load_fragment<BN, TN>(Bs[kk], tn, b);
#pragma unroll
        for (unsigned i = 0; i < TM; ++i) {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                acc[i][j] = fused_multiply_add(a[i], b[j], acc[i][j]);
            }
        }
    }
}

// One staged slice (staged_rows) by MODE: FMAs in the compute type (0), TF32 tensor cores (1, 3), or
// 16-bit ones (2). RAW: the slice holds values as loaded (the cp.async pipeline), which the TF32 modes
// round as they read them; the FMAs multiply staged values as they are either way.
template <unsigned MODE, unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN, bool RAW = false,
          typename ATile, typename BTile>
__device__ __forceinline__ void slice_product(const ATile& As, const BTile& Bs, unsigned tm, unsigned tn,
                                              scalar (&acc)[TM][TN])
{
    static_assert(!RAW || MODE != 2, "the 16-bit slices are staged as stored");
    if constexpr (MODE == 0) {
        slice_fma<BM, BN, BK, TM, TN>(As, Bs, tm, tn, acc);
    } else if constexpr (MODE == 2) {
        slice_mma16<BM, BN, BK, TM, TN>(As, Bs, tm, tn, acc);
    } else {
        slice_mma<MODE, RAW, BM, BN, BK, TM, TN>(As, Bs, tm, tn, acc);
    }
}

// A staged value as the slice multiplies it, from the element as loaded: widened to the scalar type,
// and with TF32 (MODE 1) rounded when it is staged, once per block rather than once per warp that reads
// it, unless `rounded` is false (the rare path multiplies the values as they are). The staging registers
// hold elements as loaded so that no conversion waits on a load that the slice's products should hide.
template <unsigned MODE>
__device__ __forceinline__ scalar staged_value(real element, bool rounded)
{
    const scalar x = widened(element);
    if constexpr (MODE == 1) {
        return rounded ? __uint_as_float(to_tf32(x)) : x;
    } else {
        return x;
    }
}

// A block's staged slice of A (BK x BM) or B (BK x BN) in shared memory, by MODE: scalars [BK][W + pad],
// or for the 16-bit mma (2) the elements as stored, two slice rows to a 32-bit word: word [k / 2][w]
// holds row k's element in its low half when k is even, in its high half when k is odd, which is how an
// m16n8k16 fragment register pairs consecutive k.
template <unsigned MODE, unsigned BK, unsigned W> struct staged_rows {
    typedef scalar type[BK][W + SHARED_ROW_PAD];
};
template <unsigned BK, unsigned W> struct staged_rows<2, BK, W> {
    typedef unsigned type[BK / 2][W + SHARED_ROW_PAD];
};

// `pointer` made opaque to the compiler, so that it stays in a register from here on: under register pressure
// nvcc otherwise works a slice's base pointer out again at each load from it (the kernel parameter read anew, a
// 64-bit multiply-add). Kept, the FMA weight gradient ran 2-8% faster on an H100 (docs/DESIGN.md).
template <typename Pointer> __device__ __forceinline__ void keep_in_register(Pointer& pointer)
{
#ifndef CONVGEN_EMULATED
    asm volatile("" : "+l"(pointer));
#endif
}

#ifndef CONVGEN_EMULATED  // tests/emulated_cupy.py copies at once, in program order
// cp.async (sm_80 on): global memory straight into shared memory, no register in between, 4 or 16 bytes
// (both aligned to their size). Not `valid`: the destination gets zeros and nothing is read (src-size 0:
// the PTX ISA copies no byte from `source`). Copies become visible after commit_copies and
// wait_copies<N>, which waits until at most N of this thread's committed groups are still in flight.
__device__ __forceinline__ void copy_async(void* destination, const void* source, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 ::"r"((unsigned)__cvta_generic_to_shared(destination)), "l"(source), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void copy_async16(void* destination, const void* source, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 ::"r"((unsigned)__cvta_generic_to_shared(destination)), "l"(source), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;"); }
template <unsigned N> __device__ __forceinline__ void wait_copies()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// The launch's dynamic shared memory and its size in bytes.
__device__ __forceinline__ unsigned char* dynamic_shared()
{
    extern __shared__ __align__(16) unsigned char dynamic_shared_memory[];
    return dynamic_shared_memory;
}
__device__ __forceinline__ unsigned dynamic_shared_bytes()
{
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}
#endif

// A thread's COUNT copies of one slice into shared memory (the `_wgmma` kernels' A), copy i landing STEP * i
// elements after `first` (start): a float by cp.async, at once; 16-bit elements (cp.async copies 4 or 16 bytes)
// are loaded into registers and stored as they are by land(), which the loop calls one slice later, so that the
// loads have a slice's products to arrive in, and all of a slice's loads go out before any store (through
// generic pointers the compiler may not move a load above a store: on the H200 float16's weight gradient ran 3x
// bfloat16's with a load and a store per element); consecutive ones (STEP 1) eight to a 16-byte store, group q
// at `first` + 8 (q ^ group_xor) (a swizzled row). Not `valid`: a zero, nothing read. land() with nothing loaded
// since the last does nothing.
template <unsigned COUNT, unsigned STEP> struct slice_copies {
    real* first = nullptr;
#if ELEMENT_BYTES == 2
    real held[COUNT];
    unsigned group_xor = 0;
#endif
    __device__ __forceinline__ void start(real* destination, unsigned xor_groups = 0)
    {
        first = destination;
#if ELEMENT_BYTES == 2
        group_xor = xor_groups;
#endif
    }
    __device__ __forceinline__ void copy(unsigned i, const real* source, bool valid)
    {
#if ELEMENT_BYTES == 2
        held[i] = valid ? load_stored(source) : real{0};
#else
        copy_async(first + i * STEP, source, valid);
#endif
    }
    __device__ __forceinline__ void land()
    {
#if ELEMENT_BYTES == 2
        if (first != nullptr) {
            if constexpr (STEP == 1 && COUNT % 8 == 0) {
#pragma unroll
                for (unsigned i = 0; i < COUNT; i += 8) {
                    *reinterpret_cast<uint4*>(first + 8 * (i / 8 ^ group_xor)) =
                        make_uint4(element_pair(held[i], held[i + 1]), element_pair(held[i + 2], held[i + 3]),
                                   element_pair(held[i + 4], held[i + 5]), element_pair(held[i + 6], held[i + 7]));
                }
            } else {
#pragma unroll
                for (unsigned i = 0; i < COUNT; ++i) first[i * STEP] = held[i];
            }
        }
#endif
        first = nullptr;
    }
};

// The BUFFERS staged slices of A and of B (SHARED_BUFFERS, or a cp.async pipeline's STAGES): static
// arrays while the block's shared memory (they and valid_rows[BN]) stays within STATIC_SHARED_BYTES, else
// in the launch's dynamic shared memory (a static block stops at 48 KB; 128 x 128 tiles of BK = 32 take
// 69 KB), Bs from the next 16-byte boundary: the contract's gemm_slice_bytes and gemm_dynamic_shared_bytes,
// from which the launcher sizes it. A launch given less traps rather than run over its neighbour's memory.
template <unsigned MODE, unsigned BM, unsigned BN, unsigned BK, unsigned BUFFERS> struct staged_slices {
    typedef typename staged_rows<MODE, BK, BM>::type ASlice;
    typedef typename staged_rows<MODE, BK, BN>::type BSlice;
    static constexpr unsigned A_BYTES = (BUFFERS * sizeof(ASlice) + 15) / 16 * 16;
    static constexpr unsigned BYTES = A_BYTES + BUFFERS * sizeof(BSlice);
    static constexpr bool DYNAMIC = BYTES + BN * sizeof(unsigned) > STATIC_SHARED_BYTES;
    ASlice* As;
    BSlice* Bs;
    __device__ __forceinline__ staged_slices()
    {
        if constexpr (DYNAMIC) {
            if (dynamic_shared_bytes() < BYTES) __trap();
            As = reinterpret_cast<ASlice*>(dynamic_shared());
            Bs = reinterpret_cast<BSlice*>(dynamic_shared() + A_BYTES);
        } else {
            __shared__ __align__(16) ASlice a_slices[BUFFERS];
            __shared__ __align__(16) BSlice b_slices[BUFFERS];
            As = a_slices;
            Bs = b_slices;
        }
    }
};

// One loaded element into its place (k, w) of a staged slice, as the slice multiplies it: a scalar
// (staged_value), or the 16-bit element itself.
template <unsigned MODE, unsigned K, unsigned W>
__device__ __forceinline__ void stage_element(scalar (&tile)[K][W], unsigned k, unsigned w, real element,
                                              bool rounded)
{
    tile[k][w] = staged_value<MODE>(element, rounded);
}
template <unsigned MODE, unsigned K, unsigned W>
__device__ __forceinline__ void stage_element(unsigned (&tile)[K][W], unsigned k, unsigned w, real element, bool)
{
    reinterpret_cast<real*>(&tile[k / 2][w])[k % 2] = element;
}
// Four consecutive places (k, w .. w + 3), w a multiple of 4: one 16-byte store of scalars.
template <unsigned MODE, unsigned K, unsigned W>
__device__ __forceinline__ void stage_quad(scalar (&tile)[K][W], unsigned k, unsigned w, const real* elements,
                                           bool rounded)
{
    store4(&tile[k][w], staged_value<MODE>(elements[0], rounded), staged_value<MODE>(elements[1], rounded),
           staged_value<MODE>(elements[2], rounded), staged_value<MODE>(elements[3], rounded));
}
template <unsigned MODE, unsigned K, unsigned W>
__device__ __forceinline__ void stage_quad(unsigned (&tile)[K][W], unsigned k, unsigned w, const real* elements,
                                           bool rounded)
{
#pragma unroll
    for (unsigned j = 0; j < 4; ++j) {
        stage_element<MODE>(tile, k, w + j, elements[j], rounded);
    }
}

// A staged slice whose A holds an inf or NaN: acc += As^T Bs over only the terms whose B element
// exists, bit kk of valid_rows[n] (SEMANTICS §3 forms no product with padding, and 0 * inf would be
// NaN). The rare path: not unrolled over kk, so it adds little code; FMAs in every MODE, at the
// accumulators' tile positions.
template <unsigned MODE, unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN, typename ATile,
          typename BTile>
__device__ __forceinline__ void slice_fma_masked(const ATile& As, const BTile& Bs, const unsigned (&valid_rows)[BN],
                                                 unsigned tm, unsigned tn, scalar (&acc)[TM][TN])
{
    static_assert(BK <= 32, "one bit per slice row");
    unsigned bits[TN];
#pragma unroll
    for (unsigned j = 0; j < TN; ++j) {
        bits[j] = valid_rows[tile_col<MODE, BN, TN>(tn, j)];
    }
#pragma unroll 1
    for (unsigned kk = 0; kk < BK; ++kk) {
        scalar a[TM], b[TN];
        load_tile_values<MODE, BM, TM, true>(As, kk, tm, a);
        load_tile_values<MODE, BN, TN, false>(Bs, kk, tn, b);
#pragma unroll
        for (unsigned i = 0; i < TM; ++i) {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                if (bits[j] >> kk & 1u) acc[i][j] = fused_multiply_add(a[i], b[j], acc[i][j]);
            }
        }
    }
}

// Whether a staged value sends its slice down the rare path: an inf or NaN (SEMANTICS §3 skips the
// terms of padding, which 0 * inf would poison). The TF32 modes (1, 3) also send values whose TF32
// rounding overflows (|x| >= 0x7f7ff000's float), and look at B too: their fragments are rounded with
// integer arithmetic that is exact only for the values left (slice_mma).
template <unsigned MODE>
__device__ __forceinline__ bool rare_value(scalar x)
{
    if constexpr (MODE == 0) {
        return !isfinite(x);
    } else {
        return !(fabsf(x) < __uint_as_float(0x7f7ff000u));  // NaN too
    }
}
// The same test on an element as loaded: a 16-bit value is far inside TF32's range, so in every MODE it
// is rare only as an inf or NaN, told by its exponent bits without widening it.
template <unsigned MODE>
__device__ __forceinline__ bool rare_element(real element)
{
#if ELEMENT_BYTES == 2
    constexpr unsigned short EXPONENT = ELEMENT_BF16 ? 0x7f80u : 0x7c00u;
    return (element.bits & EXPONENT) == EXPONENT;
#else
    return rare_value<MODE>(element);
#endif
}
template <unsigned MODE, unsigned N>
__device__ __forceinline__ bool any_rare(const real (&values)[N])
{
    bool found = false;
#pragma unroll
    for (unsigned i = 0; i < N; ++i) {
        found = found || rare_element<MODE>(values[i]);
    }
    return found;
}
template <unsigned MODE, unsigned R, unsigned N>
__device__ __forceinline__ bool any_rare(const real (&values)[R][N])
{
    bool found = false;
#pragma unroll
    for (unsigned r = 0; r < R; ++r) {
        found = found || any_rare<MODE>(values[r]);
    }
    return found;
}
// A thread's staged slice: A's values, and in the TF32 modes B's ([columns][rows] in conv kernels); the
// FMAs and the 16-bit mma (2) multiply B's values as they are.
template <unsigned MODE, unsigned NA, typename BStage>
__device__ __forceinline__ bool any_rare_staged(const real (&a)[NA], const BStage& b)
{
    if constexpr (MODE == 0 || MODE == 2) {
        return any_rare<MODE>(a);
    } else {
        return any_rare<MODE>(a) || any_rare<MODE>(b);
    }
}

// Whether every accumulator of the thread is finite (the cp.async pipeline's test for the rare path).
template <unsigned TM, unsigned TN>
__device__ __forceinline__ bool all_finite(const scalar (&acc)[TM][TN])
{
    bool finite = true;
#pragma unroll
    for (unsigned i = 0; i < TM; ++i) {
#pragma unroll
        for (unsigned j = 0; j < TN; ++j) {
            finite = finite && isfinite(acc[i][j]);
        }
    }
    return finite;
}

// The register tile to dest[m * N + n], rows m < M and columns n < N only; dest is the stage's
// output (`real`) or its partial buffer (`scalar`, gemm_output).
template <unsigned MODE, unsigned M, unsigned N, unsigned BM, unsigned BN, unsigned TM, unsigned TN, typename Out>
__device__ __forceinline__ void store_tile(Out* __restrict__ dest, unsigned m0, unsigned n0, unsigned tm,
                                           unsigned tn, const scalar (&acc)[TM][TN])
{
#pragma unroll
    for (unsigned i = 0; i < TM; ++i) {
        const unsigned m = m0 + tile_row<MODE, BM, TM>(tm, i);
        if (m >= M) continue;
        Out* __restrict__ row = dest + (size_t)m * N;
        if constexpr (MODE == 0 && TN % 4 == 0 && N % 4 == 0) {
#pragma unroll
            for (unsigned g = 0; g < TN / 4; ++g) {
                const unsigned n = n0 + frag_index<BN, TN>(tn, 4 * g);
                if (n < N) store4(row + n, acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]);
            }
        } else if constexpr (MODE != 0 && N % 2 == 0) {
            // Columns j, j + 1 of a C fragment are adjacent, the first even: one store of the pair.
#pragma unroll
            for (unsigned g = 0; g < TN / 2; ++g) {
                const unsigned n = n0 + tile_col<MODE, BN, TN>(tn, 2 * g);
                if (n < N) store2(row + n, acc[i][2 * g], acc[i][2 * g + 1]);
            }
        } else {
#pragma unroll
            for (unsigned j = 0; j < TN; ++j) {
                const unsigned n = n0 + tile_col<MODE, BN, TN>(tn, j);
                if (n < N) put(row + n, acc[i][j]);
            }
        }
    }
}

// Second pass of a split stage: dest[i] = partial[0][i] + partial[1][i] + ..., in that order, over
// `images` outputs of COUNT elements each (partial: [SPLIT][images][COUNT]), block `block_index` of the pass's grid.
// V elements a thread, as the launch plan counts: four where COUNT is a multiple of four and at least
// SPLIT_SUM_QUAD_COUNT, else one.
template <unsigned long long COUNT, unsigned SPLIT>
__device__ __forceinline__ void split_sum(unsigned block_index, const scalar* __restrict__ partial,
                                          real* __restrict__ dest, unsigned images)
{
    constexpr unsigned V = COUNT % 4 == 0 && COUNT >= SPLIT_SUM_QUAD_COUNT ? 4 : 1;
    const size_t i = (size_t)block_index * BLOCK + threadIdx.x;
    const size_t count = COUNT * images;
    if (i >= count / V) return;
    // Loads a batch at a time, added in order: ptxas kept four in flight, which left 3xTF32 64->64's reduce
    // (SPLIT 52) latency-bound on the H200.
    constexpr unsigned BATCH = 16;
    scalar sum[V] = {};
    for (unsigned first = 0; first < SPLIT; first += BATCH) {
        scalar v[BATCH][V];
#pragma unroll
        for (unsigned b = 0; b < BATCH; ++b) {
            if (first + b < SPLIT) {
                if constexpr (V == 4) {
                    ldg4(partial + (first + b) * count, i, v[b]);
                } else {
                    v[b][0] = __ldg(partial + (first + b) * count + i);
                }
            }
        }
#pragma unroll
        for (unsigned b = 0; b < BATCH; ++b) {
            if (first + b < SPLIT) {
#pragma unroll
                for (unsigned j = 0; j < V; ++j) sum[j] = first + b == 0 ? v[b][j] : sum[j] + v[b][j];
            }
        }
    }
    if constexpr (V == 4) {
        store4(dest + 4 * i, sum[0], sum[1], sum[2], sum[3]);
    } else {
        put(dest + i, sum[0]);
    }
}
