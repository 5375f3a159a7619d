# C-level interface of the row readers (readers.h, SPEC §8): the job, the serial reader, the
# io_uring ring and the engine (its pread pool and its ring loop).  Declarations only, cimported by
# reader.pyx and engine.pyx (no module of its own).
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "readers.h" nogil:
    int ENGRAM_ESHORT
    int ENGRAM_HAVE_URING
    int ENGRAM_HAVE_FADVISE
    int ENGRAM_HAVE_PREADV2
    int RWF_DONTCACHE
    const char* ENGRAM_URING_BUILD
    int ENGRAM_URING_HEADERS
    ctypedef struct engram_req:
        int fd
        uint64_t span_off
        uint32_t span_len
        uint32_t first
        uint32_t count
    ctypedef struct engram_ioerr:
        int err
        int64_t req
        uint64_t offset
        int64_t got
    ctypedef struct engram_job:
        uint64_t drop_granule
        int rw_flags
        uint32_t row_bytes
        const engram_req* reqs
        int64_t nreq
        const uint64_t* row_off
        uint8_t* staging
    ctypedef struct engram_ring:
        pass
    int engram_read_serial(const engram_job* job, uint8_t* buf, engram_ioerr* e)
    int posix_memalign(void** p, size_t align, size_t size)
    # the shared engine (io_engine.h)
    int ENGRAM_RUN_POOL
    int ENGRAM_RUN_RING
    int ENGRAM_RUN_AUTO
    int ENGRAM_REQ_RING
    int ENGRAM_REQ_RING_START
    int ENGRAM_REQ_POOL
    ctypedef struct engram_engine:
        pass
    ctypedef struct engram_client:
        int64_t held
        int jobs
        uint64_t reads
    ctypedef struct engram_run_info:
        int on_ring
        int depth
        uint64_t others
    ctypedef struct engram_engine_stats:
        int readers, threads, idle, rings, free_rings, jobs, active_clients, max_jobs, ring_batch
        int64_t held
        uint64_t issued, ring_jobs, pool_jobs, waiting
    engram_engine* engram_engine_create(int readers, int max_jobs, int ring_batch, int pool_threads, int* err)
    void engram_engine_destroy(engram_engine* e)
    void engram_engine_fork_prepare(engram_engine* e)
    void engram_engine_fork_parent(engram_engine* e)
    void engram_engine_fork_child(engram_engine* e)
    void engram_engine_grow(engram_engine* e, int readers)
    int engram_engine_start_pool(engram_engine* e)
    void engram_engine_set_pool_threads(engram_engine* e, int threads)
    void engram_engine_drop_rings(engram_engine* e)
    int engram_engine_ready_ring(engram_engine* e, int depth, size_t buf_bytes, size_t align)
    ctypedef struct engram_async:
        pass
    void engram_engine_begin(engram_engine* e, engram_client* c, const engram_job* job, int depth, int mode,
                             size_t buf_bytes, size_t align, int detach, engram_async* a)
    int engram_engine_finish(engram_async* a, uint8_t* caller_buf, engram_ioerr* err, engram_run_info* info)
    int engram_engine_run(engram_engine* e, engram_client* c, const engram_job* job, int depth, int mode,
                          size_t buf_bytes, size_t align, uint8_t* caller_buf, engram_ioerr* err,
                          engram_run_info* info)
    void engram_engine_get_stats(engram_engine* e, engram_engine_stats* s)
    void engram_engine_set_ring_batch(engram_engine* e, int ring_batch)
