"""The parts of benchmarks/bench.py: the case table, timing, the contestants, one case's measurement,
the child processes, issue 9's targets, the host overhead and the report. Only the standard library
and `convgen.geometry` are imported at module level; CuPy, PyTorch, NumPy and JAX load inside the
functions that need them."""
