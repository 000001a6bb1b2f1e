"""The docstrings of the generated tape methods, derived from a lowered op: what each argument is,
the shapes read and returned, and the output extents, in Python terms (SEMANTICS §1-§2), with the
optional arguments of §8. The same text serves the CPU and the CUDA tape, so it names neither.
"""

from __future__ import annotations

import textwrap

from convgen.generator.contract import MAX_RANK, Family
from convgen.generator.lower import CheckKind, GeometryParam, OpSpec, Role

_NOUN = {
    Family.CONV: "convolution",
    Family.CONV_TRANSPOSE: "transposed convolution",
    Family.MAX_POOL: "max pooling",
    Family.AVG_POOL: "average pooling",
    Family.SMOOTH_MAX_POOL: "smooth max pooling",
}
_DETAIL = {
    Family.CONV: "A cross-correlation, as PyTorch's convolutions compute; padding reads zeros.",
    Family.CONV_TRANSPOSE: "The adjoint of the convolution of the same geometry; padding crops the output.",
    Family.MAX_POOL: "Each output is the first strictly largest cell of its window; padded cells never win.",
    Family.AVG_POOL: "Each output is the mean of its window; padded cells count as zeros, and in the divisor.",
    Family.SMOOTH_MAX_POOL: "Each output is (1/beta) * log(sum(exp(beta * v))) over the window's cells v; "
                            "padded cells take part as zeros.",
}
_ROLE_WORDS = {
    Role.IN_C: "input channels",
    Role.OUT_C: "output channels",
    Role.CHANNELS: "channels, of the input and of the output",
    Role.IN_SPATIAL: "input extent",
    Role.KERNEL: "kernel extent",
    Role.STRIDE: "stride",
    Role.PADDING: "padding on each side",
}
# The optional arguments (SEMANTICS §8), over the op's argument names.
_OPTION_WORDS = {
    Role.BATCH: "{batch}: None for one image, or the number of images, an int >= 0: the input and the output then "
                "have a leading axis of that length, and every image is computed alike.",
    Role.DILATION: "{dilation}: None for all 1, or the spacing of the kernel cells per spatial axis, a sequence "
                   "of d ints > 0.",
    Role.GROUPS: "{groups}: channel groups, an int > 0 dividing {in_c} and {out_c}: the output channels of group j "
                 "are computed from the input channels of group j only.",
    Role.PADDING_MODE: "{padding_mode}: 'zeros', or 'circular': a cell outside the input reads it periodically, "
                       "x[pos % n] along an axis of n cells (each {padding}[i] <= {in_spatial}[i]).",
    Role.OUTPUT_PADDING: "{output_padding}: None for all 0, or what is added to each nonzero output extent, a "
                         "sequence of d ints, each {output_padding}[i] < {output_padding_bound}.",
}
_WIDTH = 100
_AXIS_WORDS = ("height", "width")
_ID_WORDS = ("the kernel", "the bias", "the input")  # the order of a conv's ids


class _Shapes:
    """The spelling of the op's tensor shapes over its own argument names."""

    def __init__(self, op: OpSpec) -> None:
        self.op = op
        names = {p.role: p.python_name for p in (*op.geometry, *op.options)}
        self.in_c = names.get(Role.IN_C) or names[Role.CHANNELS]
        self.out_c = names.get(Role.OUT_C, self.in_c)
        self.batch = names.get(Role.BATCH)
        self.dilation = names.get(Role.DILATION)
        self.groups = names.get(Role.GROUPS)
        self.output_padding = names.get(Role.OUTPUT_PADDING)
        stride = names[Role.STRIDE]
        bound = f"max({stride}[i], {self.dilation}[i])" if self.dilation else f"{stride}[i]"
        self.names = {role.value: name for role, name in names.items()} | {
            "in_c": self.in_c, "out_c": self.out_c, "output_padding_bound": bound}

    def axes(self, role: Role) -> list[str]:
        """`['*kernel']` for a vector, `['k_h', 'k_w']` for the *2d* scalars."""
        params = sorted((p for p in self.op.geometry if p.role is role), key=lambda p: p.axis or 0)
        return [f"*{p.python_name}" if p.is_vector else p.python_name for p in params]

    def out_axes(self) -> list[str]:
        return ["*out_spatial"] if self.op.rank is None else [f"out_{'hw'[axis]}" for axis in range(self.op.rank)]

    def shape(self, *parts: str | list[str]) -> str:
        flat = [name for part in parts for name in ([part] if isinstance(part, str) else part)]
        return "[" + ", ".join(flat) + "]"

    def batched(self, channels: str, spatial: list[str]) -> str:
        """The shape of an image, and with a batch argument the batched one too."""
        one = self.shape(channels, spatial)
        return f"{one}, or {self.shape(self.batch, channels, spatial)} with a {self.batch}" if self.batch else one

    def inputs(self) -> list[str]:
        """`id: what it names` for each id argument."""
        spatial = self.axes(Role.IN_SPATIAL)
        if not self.op.family.is_conv:
            (x_id,) = self.op.id_params
            return [f"{x_id}: id of the input node, shape {self.batched(self.in_c, spatial)}."]
        channels = [self.in_c, self.out_c] if self.op.family is Family.CONV_TRANSPOSE else [self.out_c, self.in_c]
        if self.groups:
            channels[1] += f" // {self.groups}"
        shapes = (self.shape(*channels, self.axes(Role.KERNEL)), self.shape(self.out_c),
                  self.batched(self.in_c, spatial))
        return [f"{name}: id of {what} node, shape {shape}."
                for name, what, shape in zip(self.op.id_params, _ID_WORDS, shapes)]

    def extent(self) -> str:
        """The output extent along one axis, as Python over the argument names."""
        n, kernel, s = (self.axis_name(role) for role in (Role.IN_SPATIAL, Role.KERNEL, Role.STRIDE))
        k = "k" if self.dilation else kernel
        dilated = f", with k = {self.dilation}[i] * ({kernel} - 1) + 1" if self.dilation else ""
        p = self.axis_name(Role.PADDING) if self.op.padded else None
        grown, shrunk = (f"{n} + 2 * {p}", f" - 2 * {p}") if p else (n, "")
        if self.op.family is Family.CONV_TRANSPOSE:
            extra = f", plus {self.output_padding}[i] when that is nonzero" if self.output_padding else ""
            return f"max(({n} - 1) * {s} + {k}{shrunk}, 0), or 0 if {n} == 0{extra}{dilated}"
        formula = f"({grown} - {k}) // {s} + 1, or 0 if {grown} < {k}"
        if self.op.family is not Family.CONV and p:
            formula += f" or {n} == 0 or {p} > {k} // 2"
        return formula + dilated

    def axis_name(self, role: Role) -> str:
        """The argument of `role` along axis i (N-D) or along the height (*2d*)."""
        param = next(p for p in self.op.geometry if p.role is role and p.axis in (None, 0))
        return f"{param.python_name}[i]" if param.is_vector else param.python_name


def _positive(op: OpSpec) -> set[str]:
    """The geometry names that must be nonzero: the hypotheses' and the stride."""
    kinds = (CheckKind.NONZERO, CheckKind.NONZERO_EACH, CheckKind.STRIDE)
    return {name for check in op.checks if check.kind in kinds for name in check.params}


def _geometry_line(param: GeometryParam, positive: set[str]) -> str:
    bound = "> 0" if param.python_name in positive else ">= 0"
    if param.is_vector:
        count = f"1 to {MAX_RANK}" if param.role is Role.IN_SPATIAL else "d"
        return f"{param.python_name}: {_ROLE_WORDS[param.role]} per spatial axis, a sequence of {count} ints {bound}."
    words = _ROLE_WORDS[param.role]
    if param.axis is not None:
        words = f"{words} along the {_AXIS_WORDS[param.axis]}"
    elif param.role in (Role.STRIDE, Role.PADDING):
        words = f"{words}, for both axes"
    return f"{param.python_name}: {words}, an int {bound}."


def _wrapped(text: str, indent: str = "", hang: str = "") -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=indent, subsequent_indent=indent + hang,
                         break_on_hyphens=False)


def docstring(op: OpSpec) -> str:
    """The method docstring of `op`: plain text, lines of at most _WIDTH characters."""
    shapes = _Shapes(op)
    in_spatial = shapes.axis_name(Role.IN_SPATIAL).removesuffix("[i]")
    rank = "2-D" if op.rank == 2 else "N-D"
    padding = "" if op.padded else ", without padding"
    images = " or of a batch of them" if shapes.batch else ""
    detail = _DETAIL[op.family] if op.padded else _DETAIL[op.family].split(";")[0] + "."
    if op.rank is None:
        detail += f" d = len({in_spatial}) is the number of spatial axes, 1 to {MAX_RANK}."
    lines = [f"{rank} {_NOUN[op.family]} of one channels-first image{images}{padding}.", ""]
    positional = "Ids and beta are" if op.beta_param else "Ids are"
    optional = ", then optional arguments" if op.options else ""
    lines += _wrapped(detail) + ["", f"{positional} positional, geometry keyword-only{optional}:"]
    entries = list(shapes.inputs())
    if op.beta_param:
        entries.append(f"{op.beta_param}: the sharpness, a real number; rounded to float32 it must be finite and "
                       "nonzero (a negative beta gives a smooth min).")
    positive = _positive(op)
    entries += [_geometry_line(param, positive) for param in op.geometry]
    entries += [_OPTION_WORDS[param.role].format(**shapes.names) for param in op.options]
    lines += [line for entry in entries for line in _wrapped(entry, "    ", "    ")]
    out_shape = shapes.batched(shapes.out_c, shapes.out_axes())
    where = "out_spatial[i]" if op.rank is None else "out_h"
    likewise = "" if op.rank is None else " (out_w likewise, along the width)"
    lines += ["", "Returns:"]
    lines += _wrapped(f"Result of (Tape, id): a new tape with the output node, of shape {out_shape}, where "
                      f"{where} = {shapes.extent()}{likewise}. On a bad argument the Result holds the error "
                      "message, and this tape is unchanged.", "    ")
    return "\n".join(lines)
