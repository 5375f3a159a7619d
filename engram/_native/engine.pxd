# The native shared engine's classes, for the row reader to cimport (engine.pyx).
from engram._native.readers cimport engram_client, engram_engine


cdef class Engine:
    cdef engram_engine* e
    cdef public bint abandoned
    cdef engram_engine* _get(self) except NULL


cdef class Client:
    cdef engram_client c
    cdef readonly Engine engine
