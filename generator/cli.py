"""The `convgen` command: spec files -> parse -> checks -> lower -> emit -> generated/ (`build`),
plus `list` (the ops' Python signatures), `compile` (NVRTC over every generated source) and
`demo` (a small 4-D network on the tape).

Inside a convgen checkout (see checkout.py) `build` reads the checkout's spec/ and templates/ and
writes its generated/, whether convgen is installed editable or not; elsewhere it needs --spec and
--out. Exit status: 0 done, 1 `build --check` found drift, 2 a usage error, a spec error or an output
folder that cannot be written safely, 3 an internal error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import click
import jinja2
from convgen.generator import checks, emit, lower, parse, write
from convgen.generator.checkout import find_checkout, spec_label
from convgen.generator.contract import ELEMENT_TYPES, MAX_RANK, PRECISION_MMA_MODES, Family
from convgen.generator.model import SpecError

# The installed package (the checkout itself when installed editable): its spec is what `list` shows
# outside a checkout.
PACKAGED_SPEC_DIR = Path(__file__).resolve().parent.parent / "spec"
EXIT_DRIFT, EXIT_USAGE, EXIT_INTERNAL = 1, 2, 3
T = TypeVar("T")
_NO_CHECKOUT = ("not inside a convgen checkout (a folder holding pyproject.toml of project 'convgen', spec/ and "
                "generated/, or a folder below one): run inside a convgen checkout, or pass --spec and --out")


def _fail(command: str, message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"convgen {command}: {message}", err=True)
    sys.exit(code)


def load_ops(spec_paths: list[Path]) -> tuple[lower.OpSpec, ...]:
    """Parse, check and lower the spec files; raises SpecError with a located message, OSError if
    a file cannot be read."""
    specs = []
    for path in spec_paths:
        label = spec_label(path)
        specs.append(parse.parse_spec(parse.decode_spec(path.read_bytes(), label), label))
    checks.check_specs(specs)
    return lower.lower_spec(specs)


def generate(spec_paths: list[Path], template_dir: Path = emit.TEMPLATE_DIR) -> dict[str, str]:
    """Every file of generated/ for these spec files, manifest included: relative path -> text."""
    label = ", ".join(spec_label(p) for p in spec_paths)
    files = emit.generate(load_ops(spec_paths), label, template_dir)
    files[write.MANIFEST] = write.manifest_text(emit.header_line(label), list(files))
    return dict(sorted(files.items()))


def _load_or_exit(command: str, action: Callable[[], T]) -> T:
    """`action()`, with every spec problem a message and exit 2, and never a traceback."""
    try:
        return action()
    except SpecError as error:
        click.echo(str(error), err=True)
        sys.exit(EXIT_USAGE)
    except jinja2.TemplateNotFound as error:  # an OSError too: a broken installation, not the user's input
        _fail(command, f"internal error: template {error.name} not found ({error.message})", EXIT_INTERNAL)
    except OSError as error:
        _fail(command, f"cannot read {error.filename}: {error.strerror}")
    except emit.GeneratedCodeError as error:
        _fail(command, f"internal error: {error}; this is a bug in convgen, please report it with the spec",
              EXIT_INTERNAL)


@dataclass(frozen=True, slots=True)
class _Workspace:
    """What `build` reads and writes."""

    spec_paths: list[Path]
    out: Path
    template_dir: Path
    default_out: Path | None  # the checkout's generated/, if working in one


def _workspace(spec: tuple[Path, ...], out: Path | None) -> _Workspace:
    """The checkout around the current folder supplies what --spec and --out leave out."""
    checkout = find_checkout(Path.cwd())
    if checkout is None:
        if not (spec and out):
            _fail("build", _NO_CHECKOUT)
        return _Workspace(list(spec), out, emit.TEMPLATE_DIR, None)
    spec_paths = list(spec) or sorted(checkout.spec_dir.glob("*.lean"))
    if not spec_paths:
        _fail("build", f"no spec files: {checkout.spec_dir} has no *.lean")
    return _Workspace(spec_paths, out or checkout.out_dir, checkout.template_dir, checkout.out_dir)


def _fix_command(spec: tuple[Path, ...], workspace: _Workspace) -> str:
    parts = ["convgen build"] + [f"--spec {p}" for p in spec]
    if workspace.default_out is None or workspace.out.resolve() != workspace.default_out:
        parts.append(f"--out {workspace.out}")
    return " ".join(parts)


@click.group()
def main() -> None:
    """Generate, check and compile convgen's CUDA convolution and pooling kernels."""


_SPEC_OPTION = click.option(
    "--spec", "spec", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Spec file (repeatable). Default: spec/*.lean of the convgen checkout around the current folder.")


@main.command()
@_SPEC_OPTION
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder to write (or, with --check, to compare). Default: generated/ of the checkout.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if --out differs from what the spec gives.")
def build(spec: tuple[Path, ...], out: Path | None, check: bool) -> None:
    """Regenerate the generated/ tree from the spec files.

    Inside a convgen checkout (the current folder or a parent holds its pyproject.toml, spec/ and
    generated/) --spec and --out default to the checkout's, and its templates/ are used; elsewhere
    pass both. The build replaces and removes only files it wrote (headed "Code generated by
    convgen", listed in manifest.txt), leaves every other file alone and writes through no symbolic
    link.

    \b
    Exit status:
      0  built, or up to date (--check)
      1  out of date (--check): stale, missing, extra or foreign files are listed
      2  usage error, spec error (a located message), or --out cannot be written safely
      3  internal error (a bug in convgen)
    """
    workspace = _workspace(spec, out)
    files = _load_or_exit("build", lambda: generate(workspace.spec_paths, workspace.template_dir))
    try:
        update = write.plan(workspace.out, files)
        if check:
            _report_check(update, _fix_command(spec, workspace))
            return
        write.apply(update)
    except write.OutError as error:
        _fail("build", str(error))
    except OSError as error:
        _fail("build", f"cannot write {error.filename}: {error.strerror}")
    click.echo(f"{workspace.out}: {len(files)} files ({len(update.stale)} updated, {len(update.missing)} added, "
               f"{len(update.extra)} removed)")


def _report_check(update: write.Plan, fix: str) -> None:
    if update.up_to_date:
        click.echo(f"{update.out}: {len(update.files)} files up to date")
        return
    click.echo(f"{update.out} is out of date with the spec and templates:", err=True)
    kinds = (("stale", update.stale), ("missing", update.missing), ("extra", update.extra),
             ("foreign", update.foreign))
    for kind, paths in kinds:
        for path in paths:
            click.echo(f"  {kind}: {path}", err=True)
    click.echo(f"run: {fix}", err=True)
    sys.exit(EXIT_DRIFT)


def python_signature(op: lower.OpSpec) -> str:
    positional = list(op.id_params) + ([op.beta_param] if op.beta_param else [])
    keywords = [p.python_name for p in op.geometry] + [f"{p.python_name}={p.default!r}" for p in op.options]
    return f"{op.name}({', '.join(positional)}, *, {', '.join(keywords)}) -> Result"


@main.command(name="list")
@_SPEC_OPTION
def list_ops(spec: tuple[Path, ...]) -> None:
    """Print every op's Python signature and family (outside a checkout: of the installed spec).

    Exit status: 0 done, 2 usage or spec error.
    """
    checkout = find_checkout(Path.cwd())
    spec_paths = list(spec) or sorted((checkout.spec_dir if checkout else PACKAGED_SPEC_DIR).glob("*.lean"))
    if not spec_paths:
        _fail("list", "no spec files: pass --spec")
    for op in _load_or_exit("list", lambda: load_ops(spec_paths)):
        rank = "2" if op.rank else "1..8"
        click.echo(f"{python_signature(op)}    # {op.family.value}, rank {rank}")


@main.command(name="compile")
@click.option("--arch", default="sm_90", show_default=True, help="Real GPU architecture to compile for.")
@click.option("--dtype", type=click.Choice([*ELEMENT_TYPES, "all"]), default="all", show_default=True,
              help="Element type to compile the sources for (all: each).")
@click.option("--precision", type=click.Choice([*PRECISION_MMA_MODES, "all"]), default="highest", show_default=True,
              help="How the conv GEMMs multiply: highest (FMAs), high (3xTF32), medium (TF32); all: each. "
                   "The conv sources are compiled again per tensor-core precision, in each element type that takes it.")
def compile_sources(arch: str, dtype: str, precision: str) -> None:
    """Compile every generated CUDA source with NVRTC (no GPU needed); report registers and spills."""
    from convgen.generator import cli_cuda

    cli_cuda.compile_sources(arch, dtype, tuple(PRECISION_MMA_MODES) if precision == "all" else (precision,))


@main.command(name="source")
@click.argument("family", type=click.Choice([f.value for f in Family]))
@click.argument("rank", type=click.IntRange(1, MAX_RANK))
@click.option("--in-c", type=click.IntRange(1), help="Input channels (default: the compile check's geometry).")
@click.option("--out-c", type=click.IntRange(1), help="Output channels (conv families).")
@click.option("--in", "spatial", help="Input extents, NxN... (one N for every axis).")
@click.option("--kernel", help="Kernel extents, NxN...")
@click.option("--stride", help="Strides, NxN...")
@click.option("--padding", help="Paddings, NxN...")
@click.option("--dilation", help="Dilations, NxN... (default 1).")
@click.option("--groups", type=click.IntRange(1), default=1, show_default=True, help="Groups (conv families).")
@click.option("--batch", type=click.IntRange(1), help="Images per call: the tiles are chosen for it.")
@click.option("--dtype", type=click.Choice(list(ELEMENT_TYPES)), default="float32", show_default=True,
              help="Element type.")
@click.option("--precision", type=click.Choice(list(PRECISION_MMA_MODES)), default="highest", show_default=True,
              help="How the conv GEMMs multiply (high: float32 only; medium: float32, float16, bfloat16).")
def source(family: str, rank: int, in_c: int | None, out_c: int | None, spatial: str | None, kernel: str | None,
           stride: str | None, padding: str | None, dilation: str | None, groups: int, batch: int | None,
           dtype: str, precision: str) -> None:
    """Print the exact NVRTC input of one op and geometry: a .cu with its -D defines as #defines."""
    from convgen.generator import cli_cuda

    cli_cuda.print_source(family, rank, in_c, out_c, cli_cuda.SourceAxes(spatial, kernel, stride, padding, dilation),
                          groups, batch, dtype, precision)


@main.command()
@click.option("--device", type=click.Choice(["cpu", "cuda", "all"]), default="all", show_default=True,
              help="Which tape to run; `all` runs the CUDA tape too when a GPU is present.")
def demo(device: str) -> None:
    """Run a two-layer 4-D conv + pool network forward and backward on the tape."""
    from convgen import demo as demo_module

    sys.exit(demo_module.main(device))
