"""The parts of benchmarks/bench.py: the case table, timing, the contestants (the tape in each precision
of issue 11), one case's measurement, the child processes, the targets of issues 9, 10 and 11, the host
overhead and the report. Only the standard library and convgen's pure-Python `convgen.geometry` and
`convgen.generated.contract` are imported at module level; CuPy, PyTorch, NumPy and JAX load inside the
functions that need them."""
