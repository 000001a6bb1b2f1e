"""Launch plans (pure Python, no GPU): the scratch of a split reduction stays bounded whatever the
geometry, so no op needs an im2col-sized workspace."""

from __future__ import annotations

import itertools
import math

import pytest
from convgen.cuda_launch import SPLIT_WORKSPACE_BYTES, gemm_shapes, plan
from convgen.geometry import Family, Geometry

SIZES = [
    (Family.CONV, 3, 64, (224, 224), (7, 7), (2, 2), (3, 3)),
    (Family.CONV, 16, 128, (128, 16, 128), (3, 5, 5), (2, 1, 1), (0, 1, 0)),
    (Family.CONV, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1)),
    (Family.CONV_TRANSPOSE, 256, 128, (224, 128, 224), (1, 1, 5), (1, 1, 1), (0, 0, 0)),
    (Family.CONV_TRANSPOSE, 8, 64, (64, 64, 64), (3, 3, 3), (2, 2, 2), (1, 1, 1)),
    (Family.CONV, 8, 8, (16, 16, 16, 16), (3, 3, 3, 3), (1, 1, 1, 1), (1, 1, 1, 1)),
]


@pytest.mark.parametrize("args", SIZES, ids=lambda a: f"{a[0].value}-{a[1]}to{a[2]}-{'x'.join(map(str, a[3]))}")
def test_split_scratch_is_bounded(args):
    geom = Geometry.build(*args)
    geometry_plan = plan(geom)
    for stage, shape in gemm_shapes(geom).items():
        split = geometry_plan.splits[stage]
        scratch = split * shape.m * shape.n * 4 if split > 1 else 0
        assert scratch <= SPLIT_WORKSPACE_BYTES, (stage, split, scratch)


def test_every_stage_of_every_conv_family_is_planned():
    for family, rank in itertools.product((Family.CONV, Family.CONV_TRANSPOSE), range(1, 9)):
        geom = Geometry.build(family, 2, 3, (5,) * rank, (3,) * rank, (2,) * rank, (1,) * rank)
        geometry_plan = plan(geom)
        assert set(geometry_plan.splits) == {"forward", "backward_input", "backward_weight"}
        assert all(math.prod(geom.output_shape) and launch.grid > 0
                   for stage, launch in geometry_plan.launches.items()
                   if stage in geometry_plan.splits)
