"""Build script: only cythonizes engram/_native/*.pyx (metadata lives in setup.cfg)."""
import glob
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# OpenMP splits large hash batches across cores; Apple's clang has no -fopenmp,
# and the kernels then run on one thread.
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []


def have_liburing() -> bool:
    """liburing headers and library present (Debian: liburing-dev): enables the io_uring backend."""
    if not sys.platform.startswith("linux") or os.environ.get("ENGRAM_NO_URING"):
        return False
    heads = ["/usr/include/liburing.h", "/usr/local/include/liburing.h"]
    libs = glob.glob("/usr/lib/*/liburing.so") + glob.glob("/usr/lib/liburing.so") + \
        glob.glob("/usr/local/lib/liburing.so")
    return any(os.path.exists(h) for h in heads) and bool(libs)


def extension(path: str) -> Extension:
    name = "engram._native." + os.path.splitext(os.path.basename(path))[0]
    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
    libraries = []
    if name.endswith(".reader") and have_liburing():
        macros.append(("ENGRAM_HAVE_LIBURING", "1"))
        libraries.append("uring")
    # The gated add is specified to the bit (no fused multiply-add): see gate.pyx.
    fp = ["-ffp-contract=off"] if name.endswith(".gate") else []
    return Extension(
        name,
        [path],
        include_dirs=[numpy.get_include(), "engram/_native"],
        define_macros=macros,
        libraries=libraries,
        extra_compile_args=["-O3"] + fp + OPENMP,
        extra_link_args=OPENMP,
    )


extensions = [extension(p) for p in sorted(glob.glob("engram/_native/*.pyx"))]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
