"""Build script: cythonizes engram/_native/*.pyx and the fast decode loop's text (metadata lives in setup.cfg).

The io_uring read backend needs no extra package: on Linux it is compiled
whenever the kernel's uapi header <linux/io_uring.h> is there (it comes with
the C toolchain's kernel headers; the check is `__has_include` in
engram/_native/io_ring.h) and talks to the kernel through the raw
io_uring_setup / io_uring_enter system calls.  liburing is neither looked for
nor linked: one ring code path, the same on every Linux box.  Set
ENGRAM_NO_URING=1 at build time to leave the ring out (the pread pool remains).

sim.decode._native.lean is the simulator's fast decode loop compiled: its text comes from
sim/decode/lean_loop.py with the device queue's statements of sim/device/fluid.py (both loaded from
their files: they need the standard library alone), written to build/generated/ and cythonized there;
sim.decode.fast runs it only where its text is the text of now.
"""
import glob
import importlib.util
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


def _load(path: str):
    spec = importlib.util.spec_from_file_location("_build_" + os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lean_loop() -> Extension:
    """sim.decode._native.lean: the fast decode loop's text (sim.decode.lean_loop.built_text), cythonized.
    Each float operation rounds on its own (no fused multiply-add), as Python's do."""
    fluid, text = _load("sim/device/fluid.py"), _load("sim/decode/lean_loop.py")
    source = fluid.queue_function(text.LEAN_TEMPLATE, text.LEAN_NAME, text.lean_namespace()).source
    path = os.path.join("build", "generated", "lean.pyx")
    code = text.built_text(source)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.isfile(path) or open(path, encoding="utf-8").read() != code:
        with open(path, "w", encoding="utf-8") as f:
            f.write(code)
    return Extension("sim.decode._native.lean", [path], extra_compile_args=["-O3", "-ffp-contract=off"])


extensions = [extension(p) for p in sorted(glob.glob("engram/_native/*.pyx"))] + [lean_loop()]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
