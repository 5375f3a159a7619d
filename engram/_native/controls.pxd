# The arithmetic path and thread count of a kernel module, shared by codec.pyx, gate.pyx and
# project.pyx: one implementation of paths()/get_path()/set_path()/get_threads()/set_threads().
# Kernels read ``path`` and ``threads`` from nogil code.

# Path ids, slowest first; every path of a kernel gives the same bits.
cdef enum:
    PATH_PORTABLE = 0
    PATH_AVX2 = 1
    PATH_AVX512 = 2

cdef class Controls:
    cdef readonly str kernel
    cdef readonly int cpu_path
    cdef int path
    cdef int threads
