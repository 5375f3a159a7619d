/* Row readers of the storage engine (SPEC §8), included by reader.pyx.
 *
 * Three executors read the same list of requests (io_job.h):
 *   serial      one pread after another, on the calling thread (io_job.h);
 *   pread pool  persistent pread threads, the caller reading too (io_engine.h);
 *   io_uring    a ring driven by the calling thread, raw system calls, no liburing (io_ring.h:
 *               the ring itself; io_engine.h: the loop that keeps its reads in flight).
 * The pool and the ring have one submission loop each, in the engine (io_engine.h): a reader
 * runs its batches through an engine of its own (one client, its readers as the queue depth,
 * readers - 1 pool threads) or through the shared engine of its device (one queue depth for
 * all sessions, fair between them).  Every call that exists on some platforms only is guarded
 * in io_platform.h.
 */
#ifndef ENGRAM_READERS_H
#define ENGRAM_READERS_H

#include "io_platform.h"
#include "io_job.h"
#include "io_ring.h"
#include "io_engine.h"

#endif
