/* stowage's C ABI: a drop-in device allocator for frameworks (PyTorch's CUDAPluggableAllocator
 * loads stowage_malloc / stowage_free from libstowage.so) plus statistics, snapshots and errors.
 *
 * Devices are the process-wide ones (docs/configuration.md): CUDA devices when a GPU is usable
 * and STOWAGE_DEVICE is not "emulated", else emulated devices whose memory the host can read
 * and write. A stream is a cudaStream_t (NULL = the default stream); on emulated devices its
 * value names the emulated stream. One caching allocator per device, made on first use with
 * the options of STOWAGE_ALLOC_CONF.
 *
 * Errors never escape as C++ exceptions. A failing call returns NULL (stowage_malloc), -1
 * (functions returning int or ssize_t) or does nothing (stowage_free), leaves the allocator as
 * it was, and stowage_last_error() says why. Every call clears the calling thread's error first,
 * so after a successful call stowage_last_error() is "". */
#ifndef STOWAGE_STOWAGE_H
#define STOWAGE_STOWAGE_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* size bytes usable on `stream` of `device`. NULL for size 0 (not an error) and on failure
 * (negative size, bad device, out of memory or beyond the memory cap). */
void* stowage_malloc(ssize_t size, int device, void* stream);

/* Returns a block from stowage_malloc; `size` must be the size it was asked with and `device`
 * the device it came from. The block's own stream orders the free (`stream` is accepted for
 * the PyTorch prototype). NULL is a no-op. A foreign pointer, double free, wrong size or wrong
 * device changes nothing and sets stowage_last_error(). */
void stowage_free(void* ptr, ssize_t size, int device, void* stream);

/* Gives every cached, unused segment of `device` back to the device. 0, or -1 on error. */
int stowage_empty_cache(int device);

/* The block at `ptr` is also used on `stream`: its memory is not reused before `stream`
 * reaches this point. 0, or -1 on error (e.g. a pointer this allocator did not give). */
int stowage_record_stream(void* ptr, int device, void* stream);

/* The allocator's statistics as flat JSON ("allocated_bytes.all.current": ...), written into
 * buf (at most len bytes including the terminating NUL; buf may be NULL when len is 0).
 * Returns the length the whole JSON needs, without the NUL, as snprintf does; -1 on error. */
ssize_t stowage_get_stats(int device, char* buf, size_t len);

/* Resets every peak statistic to its current value. 0, or -1 on error. */
int stowage_reset_peak_stats(int device);

/* Writes the allocator's snapshot (segments, blocks, trace; docs/snapshot.md) as JSON to
 * `path`. 0, or -1 on error. */
int stowage_snapshot(int device, const char* path);

/* Caps the bytes the allocator of `device` reserves (0 removes the cap). 0, or -1 on error. */
int stowage_set_memory_cap(int device, size_t bytes);

/* Number of devices the ordinals above may name; -1 on error (e.g. a malformed STOWAGE_*). */
int stowage_device_count(void);

/* 1 when the ordinals name CUDA devices, 0 when they name emulated devices (host memory),
 * -1 on error. */
int stowage_using_cuda(void);

/* The calling thread's last error message, "" when the last call succeeded. Valid until the
 * thread's next stowage call. */
const char* stowage_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* STOWAGE_STOWAGE_H */
