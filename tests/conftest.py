"""`--emulated-cupy`: the `cuda` tests run on the CPU, on tests/emulated_cupy.py's CuPy (g++; every GPU thread an
OS thread, so pick a few tests with -k). Without the option nothing changes."""

from __future__ import annotations

import sys


def pytest_addoption(parser) -> None:
    parser.addoption("--emulated-cupy", action="store_true",
                     help="run the cuda-marked tests on an emulated CuPy (CPU, g++): slow, select with -k")


def pytest_configure(config) -> None:
    if config.getoption("--emulated-cupy"):
        from emulated_cupy import emulated_cupy

        cupy = emulated_cupy()
        sys.modules.update({"cupy": cupy, "cupy.cuda": cupy.cuda, "cupy.cuda.compiler": cupy.cuda.compiler})
