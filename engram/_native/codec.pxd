# C-level interface of the row codec (SPEC §5), for other kernels (the table reader) to cimport.
from libc.stdint cimport uint8_t

# Bytes of one encoded row (256 E4M3 codes then 8 E8M0 scales) and values it holds.
cdef enum:
    ROW_BYTES = 264
    ROW_VALUES = 256

# -1 when every value of the row decodes to a finite number; otherwise the
# first bad column (0..255): a NaN code, a NaN scale (255) or a non-finite value.
cdef int check_row(const uint8_t* raw) noexcept nogil

# Decode one row into out[0:256] (float32 holding bf16 values).  Call only on
# rows that check_row accepted.
cdef void decode_row(const uint8_t* raw, float* out) noexcept nogil
