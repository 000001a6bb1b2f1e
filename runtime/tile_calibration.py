"""The fitted constants of the tile model (convgen.tile_model), each with what it stands for and the H200
measurements it came from: benchmarks/tile_sweep.py timed every candidate tile of a set of stages against the
model's ranking (files in benchmarks/measured/), and benchmarks/model_check.py checks the picks against them
without a GPU. They steer which tile runs, never what is computed."""

# Conv-shaped stages of this many multiply-adds, whose block tile stages more of A than of B (bm >= bn),
# read A from a repacked weight P[group][kappa][c][m]. Measured on the H200 (benchmarks/tile_sweep.py,
# 2026-11-30): gather-form stages (the weight read src-major, W[src][dst][k]) gain even with scalar A
# loads: the backward_input of conv2d N8 128->128 128² took 1.66 ms with A read from W (L1 89% busy,
# the FMA pipe 38%: each A element its own 32-byte sector) and 1.33 ms repacked; N32 64->64 56² 0.340
# -> 0.278 ms. Forwards (dst-major W[dst][src][k]) gained nothing with scalar loads (conv3d N8 32->32
# 32³: 541 -> 535 µs) but do with the 16-byte loads of four rows (a_quads): conv2d N8 128->128 128²
# forward 1324 -> 1210 µs in fp32, 1459 -> 1165 in 3xTF32, 773 -> 622 in TF32. Smaller stages skip the
# pack's extra launch: gather stages under ~5 µs of FMAs, direct ones under ~20 µs (the one-image conv1d
# 64->64 4096 forward, 2^26.3 multiply-adds, went from 11.4 to 12.9 µs of kernels when packed).
PACK_MIN_MACS = 1 << 26
PACK_MIN_MACS_DIRECT = 1 << 28
# FMA stages of this many multiply-adds pack whatever their tile: on the H200 (tile_sweep, 2026-12-01) the
# B-heavy tiles of the batched cases gained too: conv2d N32 3->64 k7 forward 64x256 360 -> 299 µs,
# conv1d N32 64->64 forward 167 -> 147 and backward_input 188 -> 153, conv3d N8 32->32 backward_input
# 479 -> 437 (its forward 441 -> 439).
PACK_ANY_TILE_MACS = 1 << 31

# Fitted constants of gemm_cost (H200 sweep, benchmarks/tile_sweep.py):
ISSUE_PER_CYCLE = 4  # warp instructions an SM issues per cycle (4 schedulers)
HALF_ISSUE_WARPS = 6  # resident warps at which latency hiding reaches half the issue rate ...
FMA_REFERENCE_TILE = 32  # ... for FMA thread tiles of this many accumulators (t4x8)
# Conv-shaped FMA stages of at least this many waves of blocks (split 1) credit larger thread tiles with
# latency hiding, and debit smaller ones, in proportion to their accumulators (gemm_cost). Measured on the
# H200 (benchmarks/tile_sweep.py, 2026-12-01): t8x8 tiles ran the forward and backward_input of conv2d
# N8 128->128 128² in 1047-1053 µs against 1183-1201 for t4x8, N32 64->64 56² in 225-228 against 266-268,
# conv3d N8 32->32 32³ 441 against 473; below the reference tile, t4x8 ran conv4d N8 8->8 16⁴'s forward
# in 299 µs against 319 for t4x4 and its backward_input in 295 against 331, and t4x4 the 3-channel k7
# backward_input in 803 against 852 for t2x4 (benchmarks/measured/2026-12-01-h200-dbd1c1d-forced-tiles.txt).
# On stages of a few waves larger tiles lost (one-image conv2d 256->256 14² forward, split 36: 19.5 -> 27
# µs; conv3d 32³, split 3: 73 -> 87 µs), and in the weight gradient (128->128 N8: 1365 -> 1929 µs).
ILP_CREDIT_WAVES = 4
# Wide slices (WIDE_BK channels, twice the usual) in those many-wave FMA stages: twice the staged values in
# flight per thread, so fewer warps hide the gather's latency, though the registers they take cost a third of
# the resident blocks (128x64 t8x8: 150 -> 209 registers). On the H200 (tile_sweep.py --depths,
# benchmarks/measured/2026-12-01-h200-fba8cae-depth-sweep.*) the same block tiles ran 2-7% faster in 2-D and
# 3-D (conv2d N8 128->128 128² forward, 128x128 t8x8: 1111 -> 1034 µs; conv3d N8 32->32 32³ backward_input,
# 32x256 t8x8: 438 -> 413) and 7-12% slower in 1-D (conv1d N32 64->64 4096, 64x128 t8x8: 145 -> 160). Their
# half-issue warps scaled by this picks the fastest or within 2.8% of it on the 20 stages timed at both depths
# (regret geomean 1.006; tests/test_bench_model_check.py); stages of fewer waves were not timed with them.
WIDE_SLICE_HALF_WARPS = 0.6
# They are offered to stages of this rank and up, thread tiles of this many accumulators (t8x8; t4x8 tiles lost
# up to 32%) ...
WIDE_SLICE_MIN_RANK = 2
WIDE_SLICE_MIN_ACCUMULATORS = 64
# ... whose estimated registers stay under this: at 219 (64x64 t8x8 at 64 threads) NVRTC used 233-243 and the
# wide slices won; at 222 (32x128 t8x8 at 64 threads, two B columns of 32 rows a thread) it used 255, its cap,
# and they lost 4-22% (conv2d N32 32->32 56² forward 70.9 -> 86.3 µs against the narrow pick, N64 96->96 28²
# backward_input 292 -> 322; benchmarks/measured/2026-12-02-h200-42c62c5-depth-pairs.txt).
WIDE_SLICE_MAX_REGISTERS = 220
# Weight-gradient FMA stages, at every thread count: a warp hides latency with its thread tile's independent
# multiply-adds as well, a t8x8 warp like two of t4x8 (the conv stages' credit), and a smaller tile's warp a
# little worse than its accumulators alone say (half_warps times (32 / accumulators) ** this). Fitted on the
# H200 to 219 weight-gradient tiles of 18 shapes, 2-D, 1-D and 3-D, 3 to 256 channels, 17 of them batched
# (benchmarks/tile_sweep.py --cases ...,sweep_*; benchmarks/measured/2026-12-01-h200-08b2fc4-weight-*):
# the model's time over the measured one went from a spread (standard deviation of the log) of 0.20 to 0.15,
# and its picks from 4.4% to 1.5% slower than each shape's fastest on average. conv2d N32 64->64 56² moved to
# 64x64 t8x8 split 58 at 64 threads, 269 µs against 304 for t4x4 (t4x8 at 128 threads: 261, which the model
# still puts 5% behind); larger debits moved the 1-D and 3-channel stages to tiles up to 19% slower, and
# the t8x8 credit at 256 threads only (the rule before) left 64->64, 128->64 and 3-D 48->48 on t4x4 and
# 64x256 tiles 7-17% slower.
WEIGHT_DEBIT_EXPONENT = 0.25
SLICE_OVERHEAD = 20  # instructions of a slice beyond its loads and FMAs (loop, barrier, swaps)
BASE_REGISTERS = 40  # registers of a GEMM thread beyond its tiles and staged values
# Each slice waits on its global loads and a barrier at least once: ~1000 cycles a round trip
# (20 slices of 1-D 64->64 4096 took 19.7 us, 5 slices split 4 ways 12.9 us), which is why deep
# unsplit reductions of few blocks lose.
SLICE_LATENCY_CYCLES = 1000
# Launch, ramp-up and tail of one kernel (~6 us back to back on the sweep); the same for every
# tile, so it moves the estimates, not the choice.
KERNEL_CYCLES = 10000
SPLIT_KERNEL_CYCLES = 2000  # the launch of a split's second kernel
# What the host spends allocating a split's partial buffer and launching its reduce kernel (~8 µs with
# CuPy or convgen.torch on the H200's host). A stage whose whole unsplit run is shorter than that has
# finished before the second launch is made, so its split cannot shorten the call: such stages stay
# whole (a tiny conv went from 2 launches to 1 forward and from 5 to 3 backward).
HOST_LAUNCH_CYCLES = 13000
# Tensor cores (not yet timed: guesses from the H200's rates, for the next sweep to fit): an
# mma.sync.m16n8k8 TF32 (1024 multiply-adds) holds a scheduler's tensor pipe for about this many issue
# slots (the TF32 mma.sync rate ~4x the FP32 FMA rate; an m16n8k16 16-bit one, twice the work at twice the
# rate, about as many); 3xTF32 splits each fragment value it reads (two
# integer roundings and a subtraction: 5 instructions), TF32 rounds each value it stages (2).
MMA_ISSUE_SLOTS = 8
SPLIT_INSTRUCTIONS = 5
ROUND_INSTRUCTIONS = 2
# Conv-shaped tensor-core stages with at most this many accumulators a thread (3xTF32 holds two register
# tiles: acc and the slice's sum) get __launch_bounds__ for two blocks per SM: NVCC fits them into 128
# registers at 256 threads without spilling, and twice the warps ran faster on the H200 (benchmarks/
# NOTES.md). Larger tiles spilled and lost (3xTF32 128x128 t8x8 forward: 1053 -> 1351 us), and so did
# the weight gradient, whose index arithmetic spills at 128 (TF32 128x128 t8x8: 960 -> 1062-1128 us);
# tests/test_compile.py checks that the fitted picks of the benchmark cases compile without spills.
MMA_FITTED_ACCUMULATORS = 64
# A split's partial buffer is written and read back at ~3.0 TB/s on the sweep: short kernels
# reach about this share of the stream rate.
SPLIT_BANDWIDTH_SHARE = 3.0e12 / 4.07e12
