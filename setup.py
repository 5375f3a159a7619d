"""Build script: only cythonizes engram/_native/*.pyx (metadata lives in setup.cfg).

The io_uring read backend needs no extra package: on Linux it is compiled
whenever the kernel's uapi header <linux/io_uring.h> is there (it comes with
the C toolchain's kernel headers; the check is `__has_include` in
engram/_native/io_ring.h) and talks to the kernel through the raw
io_uring_setup / io_uring_enter system calls.  liburing is neither looked for
nor linked: one ring code path, the same on every Linux box.  Set
ENGRAM_NO_URING=1 at build time to leave the ring out (the pread pool remains).
"""
import glob
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# OpenMP splits large hash batches across cores; Apple's clang has no -fopenmp,
# and the kernels then run on one thread.
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []


def extension(path: str) -> Extension:
    name = "engram._native." + os.path.splitext(os.path.basename(path))[0]
    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
    if name.endswith(".reader") and os.environ.get("ENGRAM_NO_URING"):
        macros.append(("ENGRAM_NO_URING", "1"))
    # The gated add is specified to the bit (no fused multiply-add): see gate.pyx.
    fp = ["-ffp-contract=off"] if name.endswith(".gate") else []
    return Extension(
        name,
        [path],
        include_dirs=[numpy.get_include(), "engram/_native"],
        depends=sorted(glob.glob("engram/_native/*.h")),  # a changed header rebuilds the extension
        define_macros=macros,
        extra_compile_args=["-O3"] + fp + OPENMP,
        extra_link_args=OPENMP,
    )


extensions = [extension(p) for p in sorted(glob.glob("engram/_native/*.pyx"))]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
