# cython: language_level=3
"""Path and thread controls of the kernel modules (one implementation, cimported by each).

A kernel module makes one :class:`Controls` with the fastest path its CPU runs
(``"portable"``, ``"avx2"`` or ``"avx512"``, found with ``__builtin_cpu_supports``
in its C source) and its default thread count, and exports the bound methods as
its module functions ``paths``, ``get_path``, ``set_path``, ``get_threads`` and
``set_threads`` (:meth:`Controls.functions`).  Its nogil loops read ``path`` and ``threads`` directly.
"""

from engram.errors import ArgumentError

#: Path names by id (``PATH_PORTABLE``, ``PATH_AVX2``, ``PATH_AVX512``), slowest first.
PATH_NAMES = ("portable", "avx2", "avx512")


cdef class Controls:
    """The path in use and the thread count of one kernel module.

    Parameters
    ----------
    kernel : str
        Name used in messages (``"codec"``, ``"gate"``, ``"project"``).
    cpu_path : int
        Fastest path id this CPU runs; the path in use starts there.
    threads : int
        Default thread count of large calls (>= 1).
    """

    def __cinit__(self, str kernel, int cpu_path, int threads=1):
        if not PATH_PORTABLE <= cpu_path <= PATH_AVX512:
            raise ArgumentError(f"{kernel}: unknown path id {cpu_path}")
        if threads < 1:
            raise ArgumentError(f"{kernel}: threads must be >= 1, got {threads}")
        self.kernel = kernel
        self.cpu_path = cpu_path
        self.path = cpu_path
        self.threads = threads

    def functions(self):
        """``(paths, get_path, set_path, get_threads, set_threads)``: what a kernel module exports."""
        return self.paths, self.get_path, self.set_path, self.get_threads, self.set_threads

    def paths(self):
        """Names of the paths this CPU can run, slowest first (``"portable"`` always)."""
        return list(PATH_NAMES[:self.cpu_path + 1])

    def get_path(self):
        """Name of the path in use (the fastest the CPU runs, unless :meth:`set_path` changed it)."""
        return PATH_NAMES[self.path]

    def set_path(self, name):
        """Use path ``name`` (one of :meth:`paths`) for later calls; returns the previous name.

        Every path gives the same bits; this exists so tests and benchmarks can run each.
        Raises ``ArgumentError`` for a path this CPU cannot run.
        """
        prev = PATH_NAMES[self.path]
        if name not in self.paths():
            raise ArgumentError(f"{self.kernel} path {name!r} is not available here; available: {self.paths()}")
        self.path = PATH_NAMES.index(name)
        return prev

    def get_threads(self):
        """Threads used by calls large enough to split (see the kernel module for the size)."""
        return self.threads

    def set_threads(self, int n):
        """Set the thread count of large calls (>= 1); returns the previous value."""
        if n < 1:
            raise ArgumentError(f"threads must be >= 1, got {n}")
        prev = self.threads
        self.threads = n
        return prev
