"""What pyproject.toml cannot say: convgen._host_path, the CUDA tape's compiled host path (runtime/_host_path.c).
Optional: where it does not build (no C compiler), convgen installs without it and the tape runs its calls in
Python (convgen.cuda.HOST_PATH says which)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("convgen._host_path", ["runtime/_host_path.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"])])
