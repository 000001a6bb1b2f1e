"""Where `convgen build` works: the convgen checkout around a folder (its spec/, generated/ and
templates/), so that an installed convgen never reads or writes its own site-packages copy by default,
and how generated headers name a spec file without a machine path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# `name = "convgen"` inside the [project] table of pyproject.toml.
_PROJECT_NAME = re.compile(r"""name\s*=\s*["']convgen["']\s*(#.*)?""")


@dataclass(frozen=True, slots=True)
class Checkout:
    """A source tree of convgen: pyproject.toml naming project `convgen`, with spec/ and generated/."""

    root: Path

    @property
    def spec_dir(self) -> Path:
        return self.root / "spec"

    @property
    def out_dir(self) -> Path:
        return self.root / "generated"

    @property
    def template_dir(self) -> Path:
        return self.root / "templates"


def _names_convgen(pyproject: Path) -> bool:
    try:
        text = pyproject.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    table = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            table = stripped
        elif table == "[project]" and _PROJECT_NAME.fullmatch(stripped):
            return True
    return False


def find_checkout(start: Path) -> Checkout | None:
    """The checkout holding `start` (the folder itself or a parent), or None."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / "spec").is_dir() and (folder / "generated").is_dir() and _names_convgen(folder / "pyproject.toml"):
            return Checkout(folder)
    return None


def spec_label(path: Path) -> str:
    """How generated headers and messages name a spec file: relative to the checkout that holds it
    (`spec/ops.lean`), else its bare name; never a machine path."""
    resolved = path.resolve()
    checkout = find_checkout(resolved.parent)
    return resolved.relative_to(checkout.root).as_posix() if checkout else path.name
