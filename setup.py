"""Build script: only cythonizes engram/_native/*.pyx (metadata lives in setup.cfg)."""
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# OpenMP splits large hash batches across cores; Apple's clang has no -fopenmp,
# and the kernels then run on one thread.
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []

extensions = [
    Extension(
        "engram._native.*",
        ["engram/_native/*.pyx"],
        include_dirs=[numpy.get_include(), "engram/_native"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"] + OPENMP,
        extra_link_args=OPENMP,
    )
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
