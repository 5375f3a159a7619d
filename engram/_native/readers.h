/* Row readers of the storage engine (SPEC §8), included by reader.pyx.
 *
 * Three readers execute the same list of requests (io_job.h):
 *   serial      one pread after another, on the calling thread (io_job.h);
 *   pread pool  a persistent pool of pread threads (io_pool.h);
 *   io_uring    one ring, raw system calls, no liburing (io_ring.h).
 * A reader runs its own pool or ring, or reads through the shared engine of its device
 * (io_engine.h: one queue depth for all sessions, fair between them, the pool's threads and
 * a cache of rings).  Every call that exists on some platforms only is guarded in io_platform.h.
 */
#ifndef ENGRAM_READERS_H
#define ENGRAM_READERS_H

#include "io_platform.h"
#include "io_job.h"
#include "io_pool.h"
#include "io_ring.h"
#include "io_engine.h"

#endif
