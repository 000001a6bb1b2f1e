"""The tape: an immutable value recording leaves and op nodes, and its backward pass (SEMANTICS §5-§6).

Op methods come from the generated op table (`GeneratedOps`); this module reads and checks their
inputs, sizes the output, calls the backend and records the node. Backends subclass `Tape` and set
`backend_class` (convgen.cpu, convgen.cuda).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np
from convgen.backend import DTYPES, Backend, BackendError, OutOfMemory, precision_refusal
from convgen.checking import TOO_LARGE, describe, natural, validated
from convgen.generated.ops import GeneratedOps
from convgen.geometry import Geometry
from convgen.op import OpInfo
from convgen.result import Result, TapeError

INVALID_ID = "autograd: invalid node id"


# Node and OpRecord are NamedTuples, not frozen dataclasses: every op call makes one of each, and a frozen
# dataclass's __init__ (one object.__setattr__ per field) costs about 1 µs of a tiny op's host path.


class OpRecord(NamedTuple):
    """How an op node was made: enough to run its backward."""

    info: OpInfo
    geom: Geometry
    saved: Any  # the backend's state for backward (argmax offsets, ...)


class Node(NamedTuple):
    value: Any  # the backend's array; a leaf given `shape` keeps its flat buffer
    shape: tuple[Any, ...]  # as recorded: a leaf's `shape` argument is kept as given (SEMANTICS §6)
    dims: tuple[int, ...] | None  # `shape` as natural numbers, None when it is not a shape
    name: str | None
    requires_grad: bool
    parents: tuple[int, ...]
    op: OpRecord | None  # None for a leaf

    @property
    def readable(self) -> bool:
        """True when the buffer holds exactly the elements of a valid recorded shape: the node can
        be viewed as `dims` (and given a gradient of zeros)."""
        return self.dims is not None and self.value.size == math.prod(self.dims)


def _is_node_id(value: object, count: int) -> bool:
    return type(value) is int and 0 <= value < count


def _dims(shape: tuple[Any, ...]) -> tuple[int, ...] | None:
    """`shape` as a tuple of ints when every entry is a natural number, else None."""
    dims = tuple(natural(n) for n in shape)
    return None if None in dims else dims  # type: ignore[return-value]


def _shaped(array: Any, shape: tuple[int, ...]) -> Any:
    """`array` viewed as `shape`; reshaping only when needed, since a CuPy reshape costs microseconds."""
    return array if array.shape == shape else array.reshape(shape)


class Tape(GeneratedOps):
    """A recording of values and ops. Every op returns a new tape; this one stays as it was."""

    __slots__ = ("_nodes", "_count", "_backend")
    backend_class: ClassVar[type]
    # One backend per tape class, dtype and precision.
    _backends: ClassVar[dict[tuple[type, str, str], Backend]] = {}

    def __init__(self, *, dtype: str = "float32", precision: str = "highest") -> None:
        """An empty tape recording `dtype` values: "float32" (the contract) or "float64" (SEMANTICS §8),
        whose convolutions multiply in `precision`: "highest" (FMAs in `dtype`, the contract), "high"
        (3xTF32) or "medium" (TF32), the last two float32 only (docs/DESIGN.md, the tensor-core slice;
        the CPU tape computes every precision as "highest")."""
        name = type(self).backend_class.name
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(f"autograd: {name}: Tape: dtype must be 'float32' or 'float64', got {describe(dtype)}")
        refusal = precision_refusal(dtype, precision)
        if refusal is not None:
            raise ValueError(f"autograd: {name}: Tape: {refusal}")
        key = (type(self), dtype, precision)
        if key not in Tape._backends:
            Tape._backends[key] = type(self).backend_class(dtype, precision)
        self._backend: Backend = Tape._backends[key]
        self._nodes: list[Node] = []
        self._count = 0

    # Recording. Tapes share one append-only list; a tape sees its first `_count` nodes. Appending
    # to the newest tape is O(1); appending to an older one copies its prefix first.

    def _append(self, node: Node) -> tuple[Tape, int]:
        nodes = self._nodes if len(self._nodes) == self._count else self._nodes[: self._count]
        nodes.append(node)
        tape = object.__new__(type(self))
        tape._backend, tape._nodes, tape._count = self._backend, nodes, self._count + 1
        return tape, self._count

    def __len__(self) -> int:
        return self._count

    @property
    def dtype(self) -> str:
        """What the tape records and computes in: "float32" or "float64"."""
        return self._backend.dtype

    @property
    def precision(self) -> str:
        """How its convolutions multiply: "highest", "high" or "medium"."""
        return self._backend.precision

    def _bytes(self, elements: int) -> int:
        return elements * np.dtype(self._backend.dtype).itemsize

    def leaf(self, value: Any, *, shape: Any = None, name: str | None = None,
             requires_grad: bool = True) -> tuple[Tape, int]:
        """Record `value` as the tape's dtype with no parents; with `shape`, `value` is a flat buffer and the
        shape is recorded unchecked (the ops check what they read). A value that is not real numbers (text, complex
        numbers and dates too, which NumPy would convert), or a shape that is not a sequence, is a TypeError,
        ValueError or OverflowError saying what was wrong."""
        try:
            stored = self._backend.store(value)
        except (TypeError, ValueError, OverflowError) as error:
            raise type(error)(f"autograd: {self._backend.name}: leaf: value must be numbers (an array, a nested "
                              f"sequence or a scalar), got {describe(value)}: {error}") from None
        if shape is None:
            recorded = tuple(stored.shape)
            dims: tuple[int, ...] | None = recorded
        else:
            try:
                recorded = tuple(shape)
            except TypeError:
                raise TypeError(f"autograd: {self._backend.name}: leaf: shape must be None or a sequence, got "
                                f"{describe(shape)}") from None
            stored = stored.reshape(-1)
            dims = _dims(recorded)
        return self._append(Node(stored, recorded, dims, name, bool(requires_grad), (), None))

    def _node(self, node_id: int) -> Node:
        if not _is_node_id(node_id, self._count):
            raise TapeError(INVALID_ID)
        return self._nodes[node_id]

    def value(self, node_id: int) -> Any:
        """The node's array, shaped as recorded (a flat buffer that does not fill a valid shape comes
        back flat, as given). The CPU tape returns a read-only view. The CUDA tape returns the
        recorded array itself (CuPy has no read-only arrays): it aliases the record of this tape and
        of every tape that shares the node, and must not be written."""
        node = self._node(node_id)
        return _shaped(node.value, node.dims) if node.readable else node.value

    def shape(self, node_id: int) -> tuple[int, ...]:
        return self._node(node_id).shape

    def name(self, node_id: int) -> str | None:
        return self._node(node_id).name

    def parents(self, node_id: int) -> tuple[int, ...]:
        return self._node(node_id).parents

    # Ops: the generated methods validate their arguments (steps 1-5) and call `_apply`.

    def _read(self, info: OpInfo, ids: tuple[Any, ...], geom: Geometry) -> tuple[Any, ...] | str:
        """SEMANTICS §5 `requireValue` on each input of `geom.parent_shapes` in order: the arrays, shaped, or
        the error."""
        arrays = []
        nodes, count = self._nodes, self._count
        for param, node_id, shape, expected in zip(info.id_params, ids, geom.parent_shapes, geom.parent_numels):
            if not _is_node_id(node_id, count):
                return (f"{INVALID_ID} ({self._backend.name}: {info.name}: {param} is {describe(node_id)}, "
                        f"the tape has {count} nodes)")
            node = nodes[node_id]
            if node.dims != shape:
                return (f"autograd: shape mismatch ({self._backend.name}: {info.name}: {param} {node_id} "
                        f"has shape {describe(node.shape)}, expected {shape})")
            value = node.value
            if value.size != expected:
                return self._size_mismatch(expected, value.size)
            arrays.append(value if value.shape == shape else value.reshape(shape))  # _shaped, without a call
        return tuple(arrays)

    def _size_mismatch(self, expected: int, actual: int) -> str:
        return (f"autograd: {self._backend.buffer_label} buffer size mismatch "
                f"(shape elements={expected}, native elements={actual})")

    def _too_large(self, info: OpInfo, geom: Geometry) -> str:
        return (f"{TOO_LARGE} ({self._backend.name}: {info.name}: output shape {geom.output_shape} "
                f"has {geom.output_numel} elements)")

    def _apply(self, info: OpInfo, ids: tuple[Any, ...], check: Callable[..., Geometry | str],
               args: tuple[Any, ...]) -> Result:
        """Steps 1-5 by the op's validator `check` on `args`, then steps 6-8."""
        checked = validated(check, args)
        if type(checked) is str:
            return Result.err(checked)
        geom: Geometry = checked
        if info.reads_first:
            inputs = self._read(info, ids, geom)
            if type(inputs) is str:
                return Result.err(inputs)
            if not geom.output_fits_u32:
                return Result.err(self._too_large(info, geom))
        else:
            if not geom.output_fits_u32:
                return Result.err(self._too_large(info, geom))
            inputs = self._read(info, ids, geom)
            if type(inputs) is str:
                return Result.err(inputs)

        backend = self._backend
        out_shape, numel = geom.output_shape, geom.output_numel
        if numel == 0:  # nothing to compute: an empty node, zero gradients (SEMANTICS §2)
            out, saved = backend.zeros(out_shape), None
        else:
            try:
                out, saved = backend.forward(geom, inputs)
            except MemoryError as error:  # NumPy's: the machine cannot hold a buffer
                return Result.err(f"autograd: {backend.name}: {info.name}: {OutOfMemory.of(error, self._bytes(numel))}")
            except BackendError as error:
                return Result.err(f"autograd: {backend.name}: {info.name}: {error}")
        if out.size != numel:
            return Result.err(self._size_mismatch(numel, out.size))
        if not backend.is_native(out):
            return Result.err(f"autograd: {backend.name}: {info.name}: native output is {out.dtype} on "
                              f"{backend.device_of(out)}, expected {backend.dtype} on {backend.device}")
        node = Node(_shaped(out, out_shape), out_shape, out_shape, info.name, True, tuple(ids),
                    OpRecord(info, geom, saved))
        return Result(self._append(node))  # Result.ok's classmethod call costs 0.15 µs of a tiny op

    # Backward (SEMANTICS §6).

    def backward(self, out_id: int, seed: Any) -> Result:
        """Gradients of `out_id` seeded with `seed`: a list with one array per node, shaped like it,
        none of them an array the tape records. The entry of `out_id` is the seed as stored: a copy on
        the CPU tape; on the CUDA tape a device array of the tape's dtype is taken as it is, as `leaf`
        takes one, so that entry is the caller's own array. A node that gets no gradient gets
        zeros, or None when its recorded shape and buffer do not make a valid shape (a leaf recorded
        with a `shape` that no op can read)."""
        if not _is_node_id(out_id, self._count):
            return Result.err("autograd: invalid output id")
        seed_array = self._seed_array(seed)
        if type(seed_array) is str:
            return Result.err(seed_array)
        if tuple(seed_array.shape) != self._nodes[out_id].dims:
            return Result.err("autograd: seed gradient shape mismatch for output")
        with np.errstate(all="ignore"):  # inf and NaN gradients add up as IEEE says, silently
            return self._backward(out_id, seed_array)

    def _seed_array(self, seed: Any) -> Any:
        """`seed` as the backend's array of the tape's dtype, or the error."""
        backend = self._backend
        try:
            seed_array = backend.store(seed)
        except MemoryError as error:
            return f"autograd: {backend.name}: backward: {OutOfMemory.of(error, self._bytes(np.size(seed)))}"
        except Exception:  # what `store` refuses (text, None) and the array constructor rejects (ragged lists)
            return f"autograd: seed gradient must be an array of numbers, got {describe(seed)}"
        return seed_array  # the CUDA tape takes a device array of its dtype as is (no copy), like `leaf`

    def _backward(self, out_id: int, seed_array: Any) -> Result:
        backend, nodes = self._backend, self._nodes
        ancestor = [False] * (out_id + 1)
        ancestor[out_id] = True
        for i in range(out_id, -1, -1):
            if ancestor[i]:
                for parent in nodes[i].parents:
                    ancestor[parent] = True

        grads: dict[int, Any] = {out_id: seed_array}
        for i in range(out_id, -1, -1):
            node = nodes[i]
            if node.op is None or not ancestor[i] or not node.requires_grad or i not in grads:
                continue
            grad = grads[i]
            if tuple(grad.shape) != node.shape:
                return Result.err("autograd: upstream gradient shape mismatch")
            record = node.op
            if record.geom.output_numel == 0:
                continue  # an empty output passes nothing back
            inputs = tuple(_shaped(nodes[p].value, shape) for p, shape in zip(node.parents, record.geom.parent_shapes))
            try:
                contributions = backend.backward(record.geom, inputs, record.saved, grad)
                for parent, contribution in zip(node.parents, contributions):
                    if nodes[parent].requires_grad:
                        grads[parent] = grads[parent] + contribution if parent in grads else contribution
            except MemoryError as error:
                out_of_memory = OutOfMemory.of(error, self._bytes(record.geom.output_numel))
                return Result.err(f"autograd: {backend.name}: {record.info.name}: {out_of_memory}")
            except BackendError as error:
                return Result.err(f"autograd: {backend.name}: {record.info.name}: {error}")
        zeroed = [i for i in range(self._count) if i not in grads and nodes[i].readable]
        try:
            grads.update((i, backend.zeros(nodes[i].dims)) for i in zeroed)
        except MemoryError as error:
            needed = self._bytes(sum(nodes[i].value.size for i in zeroed))
            return Result.err(f"autograd: {backend.name}: backward: {OutOfMemory.of(error, needed)}")
        return Result.ok([grads.get(i) for i in range(self._count)])
