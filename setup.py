"""What pyproject.toml cannot say: convgen._host_path (runtime/compiled/), the compiled host path of the CUDA tape and
of convgen.torch's eager ops. Optional: where it does not build (no C compiler), convgen installs without it and the
op calls run in Python (convgen.cuda.HOST_PATH says which)."""

from setuptools import Extension, setup

SOURCES = [f"runtime/compiled/{name}.c" for name in ("module", "program", "tape_apply", "eager_call")]

setup(ext_modules=[Extension("convgen._host_path", SOURCES, depends=["runtime/compiled/host_path.h"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"])])
