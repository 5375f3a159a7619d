"""Build script: only cythonizes engram/_native/*.pyx (metadata lives in setup.cfg)."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "engram._native.*",
        ["engram/_native/*.pyx"],
        include_dirs=[numpy.get_include(), "engram/_native"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
