"""Issue 11's accuracy bounds for the tensor-core precisions, as the tests apply them (GPU, emulated and
convgen.torch): a result's relative error is ‖out − ref‖ / ‖ref on |inputs|‖ against the float64 reference.

- "medium" (TF32): at most TF32_BOUND.
- float16 and bfloat16 tensors: at most HALF_BOUND (16-bit storage in and out, float32 sums).
- "high" (3xTF32): at most HIGH_FACTOR times the FMA path's error on the same inputs, that error taken as at
  least HIGH_ERROR_FLOOR. 3xTF32 holds an operand as big + small, each an 11-bit TF32, so to 2^-22 of its
  value, and drops small·small: a product is within about 3 · 2^-22 of exact. Where the FMA path is nearly
  exact (an output that sums one or two products) "2x the FMA error" would ask for more than 3xTF32
  resolves; the floor, 2^-21, is that resolution. Sums of many products, the benchmark's, are not near it.
"""

TF32_BOUND = 1e-3
HALF_BOUND = 1e-2
HIGH_FACTOR = 2.0
HIGH_ERROR_FLOOR = 2.0 ** -21
FLOAT32_UNIT = 2.0 ** -24  # float32's unit roundoff: below a few of these no TF32 rounding took place


def high_bound(fma_error: float) -> float:
    """The largest 3xTF32 error allowed next to an FMA error of `fma_error`."""
    return HIGH_FACTOR * max(fma_error, HIGH_ERROR_FLOOR)
