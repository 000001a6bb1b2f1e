"""The `convgen` command: spec files -> parse -> checks -> lower -> emit -> generated/ (`build`),
plus `list` (the ops' Python signatures), `compile` (NVRTC over every generated source) and
`demo` (a small 4-D network on the tape).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from convgen.generator import checks, emit, lower, parse
from convgen.generator.model import SpecError

PROJECT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC_DIR = PROJECT / "spec"
DEFAULT_OUT = PROJECT / "generated"


def _spec_label(path: Path) -> str:
    """How generated headers name a spec file: relative to the project, else its bare name, so no
    machine path leaks into the output."""
    resolved = path.resolve()
    return resolved.relative_to(PROJECT).as_posix() if resolved.is_relative_to(PROJECT) else path.name


def load_ops(spec_paths: list[Path]) -> tuple[lower.OpSpec, ...]:
    """Parse, check and lower the spec files; raises SpecError with a located message."""
    specs = [parse.parse_spec(p.read_text(encoding="utf-8"), _spec_label(p)) for p in spec_paths]
    checks.check_specs(specs)
    return lower.lower_spec(specs)


def generate(spec_paths: list[Path]) -> dict[str, str]:
    """Every file of generated/ for these spec files: relative path -> text."""
    label = ", ".join(_spec_label(p) for p in spec_paths)
    return emit.generate(load_ops(spec_paths), label)


def _existing(out: Path) -> set[str]:
    """The files under `out` that a build owns (everything but Python's caches)."""
    if not out.is_dir():
        return set()
    return {p.relative_to(out).as_posix() for p in out.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _spec_paths(spec: tuple[Path, ...]) -> list[Path]:
    paths = list(spec) or sorted(DEFAULT_SPEC_DIR.glob("*.lean"))
    if not paths:
        raise click.UsageError(f"no spec files: {DEFAULT_SPEC_DIR} has no *.lean")
    return paths


def _fix_command(spec: tuple[Path, ...], out: Path) -> str:
    parts = ["convgen build"] + [f"--spec {p}" for p in spec]
    if out.resolve() != DEFAULT_OUT:
        parts.append(f"--out {out}")
    return " ".join(parts)


@click.group()
def main() -> None:
    """Generate, check and compile convgen's CUDA convolution and pooling kernels."""


@main.command()
@click.option("--spec", "spec", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Spec file (repeatable). Default: every spec/*.lean of the project.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="Folder to write (or, with --check, to compare).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if --out differs from what the spec gives.")
def build(spec: tuple[Path, ...], out: Path, check: bool) -> None:
    """Regenerate the generated/ tree from the spec files."""
    try:
        files = generate(_spec_paths(spec))
    except SpecError as error:
        click.echo(str(error), err=True)
        sys.exit(1)
    existing = _existing(out)
    stale = sorted(path for path in files if path in existing and (out / path).read_text(encoding="utf-8") != files[path])
    missing = sorted(set(files) - existing)
    extra = sorted(existing - set(files))
    if check:
        if stale or missing or extra:
            click.echo(f"{out} is out of date with the spec and templates:", err=True)
            for kind, paths in (("stale", stale), ("missing", missing), ("extra", extra)):
                for path in paths:
                    click.echo(f"  {kind}: {path}", err=True)
            click.echo(f"run: {_fix_command(spec, out)}", err=True)
            sys.exit(1)
        click.echo(f"{out}: {len(files)} files up to date")
        return
    for path in stale + missing:
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(files[path], encoding="utf-8", newline="\n")
    for path in extra:
        (out / path).unlink()
    click.echo(f"{out}: {len(files)} files ({len(stale)} updated, {len(missing)} added, {len(extra)} removed)")


def python_signature(op: lower.OpSpec) -> str:
    positional = list(op.id_params) + ([op.beta_param] if op.beta_param else [])
    keywords = [p.python_name for p in op.geometry]
    return f"{op.name}({', '.join(positional)}, *, {', '.join(keywords)}) -> Result"


@main.command(name="list")
@click.option("--spec", "spec", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Spec file (repeatable). Default: every spec/*.lean of the project.")
def list_ops(spec: tuple[Path, ...]) -> None:
    """Print every op's Python signature and family."""
    try:
        ops = load_ops(_spec_paths(spec))
    except SpecError as error:
        click.echo(str(error), err=True)
        sys.exit(1)
    for op in ops:
        rank = "2" if op.rank else "1..8"
        click.echo(f"{python_signature(op)}    # {op.family.value}, rank {rank}")


@main.command(name="compile")
@click.option("--arch", default="sm_90", show_default=True, help="Real GPU architecture to compile for.")
def compile_sources(arch: str) -> None:
    """Compile every generated CUDA source with NVRTC (no GPU needed); report registers and spills."""
    from convgen.generator import nvrtc

    failed = spilled = 0
    reports = nvrtc.compile_all(arch)
    for report in reports:
        if report.error is not None:
            failed += 1
            click.echo(f"FAIL {report.source}\n{report.error}")
            continue
        for kernel in report.kernels:
            spilled += kernel.spills
            mark = "  SPILLS" if kernel.spills else ""
            click.echo(f"{kernel.symbol:<44} {kernel.registers:>3} regs  {kernel.stack_bytes:>5} B stack  "
                       f"{kernel.spill_store_bytes:>4}/{kernel.spill_load_bytes:<4} B spill st/ld{mark}")
    seconds = sum(r.seconds for r in reports)
    click.echo(f"{len(reports) - failed}/{len(reports)} sources compiled for {arch} in {seconds:.1f} s; "
               f"{failed} failed; {spilled} kernels spill")
    if failed:
        sys.exit(1)


@main.command()
@click.option("--device", type=click.Choice(["cpu", "cuda", "all"]), default="all", show_default=True,
              help="Which tape to run; `all` runs the CUDA tape too when a GPU is present.")
def demo(device: str) -> None:
    """Run a two-layer 4-D conv + pool network forward and backward on the tape."""
    from convgen import demo as demo_module

    sys.exit(demo_module.main(device))
