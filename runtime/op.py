"""What the tape knows of one entry point: the generated op table holds one `OpInfo` per op."""

from __future__ import annotations

from dataclasses import dataclass

from convgen.geometry import Family


@dataclass(frozen=True, slots=True)
class OpInfo:
    name: str  # snake_case, as in messages and node names: `max_pool2d_pad`
    family: Family
    rank: int | None  # 2 for the *2d* ops, None for the N-D ops
    id_params: tuple[str, ...]
    beta_param: str | None
    geometry_params: tuple[str, ...]  # keyword-only, signature order
    reads_first: bool  # SEMANTICS §5 steps 6-7: *2d* ops read inputs before sizing the output
    option_params: tuple[str, ...] = ()  # keyword-only with defaults (SEMANTICS §8), after the geometry

