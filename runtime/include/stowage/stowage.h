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
 * it was (but an allocation that finds no room first gives the cached blocks back and tries once
 * more, as PyTorch's does), and stowage_last_error() says why (stowage_last_error_code() says
 * what kind of error).
 * Every call clears the calling thread's error first, so after a successful call
 * stowage_last_error() is "". The first failure of a process is also written to stderr, once,
 * even with logging off: a framework that ignores NULL still leaves a trace of why.
 *
 * Symbols: libstowage.so exports only this API and the stowage:: C++ API. */
#ifndef STOWAGE_STOWAGE_H
#define STOWAGE_STOWAGE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct DLManagedTensor; /* <dlpack/dlpack.h>; declared here so this header needs nothing else */

/* size bytes usable on `stream` of `device`. NULL for size 0 (not an error) and on failure:
 * STOWAGE_ERROR_INVALID_ARGUMENT for a negative size, a bad device or stream;
 * STOWAGE_ERROR_OUT_OF_MEMORY for any size the device or the memory cap cannot give, however
 * large (as PyTorch reports any size its allocator cannot have).
 * In a process forked from one that used the allocator, this and every other allocator entry
 * point fail with STOWAGE_ERROR_DEVICE (fork() copies no other thread, so their locks may stay
 * held, and the memory is the parent's): use stowage in a child only after exec(). */
void* stowage_malloc(ssize_t size, int device, void* stream);

/* Returns a block from stowage_malloc; `size` must be the size it was asked with (or the size of
 * the block the allocator gave, which a block reused whole may make larger than the rounded
 * request, or 0 for "unknown") and `device` the device it came from (-1: the
 * device whose allocator gave `ptr`, found by a lookup in each). The block's own stream orders
 * the free (`stream` is accepted for the PyTorch prototype). NULL is a no-op. A foreign pointer,
 * double free, wrong size or wrong device changes nothing and sets stowage_last_error(). */
void stowage_free(void* ptr, ssize_t size, int device, void* stream);

/* Gives every cached, unused segment of `device` back to the device; device -1: of every device
 * whose allocator exists. 0, or -1 on error. */
int stowage_empty_cache(int device);

/* The block at `ptr` is also used on `stream`: its memory is not reused before `stream`
 * reaches this point. `device` -1: the device whose allocator gave `ptr`. 0, or -1 on error
 * (a pointer this allocator did not give; a stream that was never created or was destroyed). */
int stowage_record_stream(void* ptr, int device, void* stream);

/* The device whose allocator gave the live block at `ptr` (its start), or -1 when none did: NULL,
 * memory stowage did not give, a block already freed. -1 is no error then (stowage_last_error_code()
 * is STOWAGE_OK); it is one where every allocator entry point fails (a forked child, a malformed
 * STOWAGE_* variable). PyTorch's allocator ignores record_stream on memory it did not give; the
 * drop-in asks this first to do the same. */
int stowage_block_device(const void* ptr);

/* The allocator's statistics as flat JSON ("allocated_bytes.all.current": ...), written into
 * buf (at most len bytes including the terminating NUL; buf may be NULL when len is 0).
 * Returns the length the whole JSON needs, without the NUL, as snprintf does; -1 on error. */
ssize_t stowage_get_stats(int device, char* buf, size_t len);

/* Resets every peak statistic to its current value. 0, or -1 on error. */
int stowage_reset_peak_stats(int device);

/* Writes the allocator's snapshot (segments, blocks, trace; docs/snapshot.md) as JSON to
 * `path`. 0, or -1 on error. */
int stowage_snapshot(int device, const char* path);

/* Writes the snapshot's JSON into buf as stowage_get_stats does (snprintf's convention). */
ssize_t stowage_snapshot_json(int device, char* buf, size_t len);

/* Caps the bytes the allocator of `device` reserves (0 removes the cap). 0, or -1 on error. */
int stowage_set_memory_cap(int device, size_t bytes);

/* Caps reserved bytes at `fraction` (0 <= fraction <= 1) of the device's capacity, as PyTorch's
 * set_per_process_memory_fraction does: 1 removes the cap, 0 refuses every new reservation.
 * 0, or -1 on error. */
int stowage_set_memory_fraction(int device, double fraction);

/* The device's memory in bytes; -1 on error. */
ssize_t stowage_device_capacity(int device);

/* Tags: every block allocated on the calling thread while a tag is pushed records the innermost
 * one (snapshots and `stowage inspect` show it). Tags nest; pop restores the outer one.
 * 0, or -1 on error (NULL tag; pop with no tag pushed). */
int stowage_push_tag(const char* tag);
int stowage_pop_tag(void);

/* A new contiguous tensor of `ndim` dimensions `shape` and DLPack type (code, bits) on `device`,
 * allocated on `stream`, as a DLManagedTensor: pass it to a DLPack consumer, which calls its
 * deleter (that frees the memory); or call the deleter yourself. Emulated devices' memory is
 * kDLCPU data. NULL on error: STOWAGE_ERROR_UNSUPPORTED for a (code, bits) stowage has no dtype
 * for (it has float 64/32/16, bfloat 16, int 64/32/16/8, uint 16/8, bool 8; one lane),
 * STOWAGE_ERROR_INVALID_ARGUMENT for a bad shape or device. */
struct DLManagedTensor* stowage_dlpack_empty(int device, const int64_t* shape, int ndim, uint8_t code, uint8_t bits,
                                             void* stream);

/* A PyCapsule destructor (PyCapsule_Destructor) for a capsule named "dltensor" that holds one of
 * these DLManagedTensors, as the Python package makes them: when the capsule was never consumed (a
 * consumer renames it "used_dltensor"), it calls the tensor's deleter. It touches no Python error
 * state, so it is safe while an exception is pending (a consumer that refused the capsule), as a
 * destructor written in Python is not. PyCapsule_IsValid and PyCapsule_GetPointer are found in the
 * running process; where there are none it does nothing. */
void stowage_dlpack_capsule_destructor(void* capsule);

/* Pinned host memory from `device`'s host pool (docs/host_pool.md): pages bound to the NUMA
 * node(s) nearest the device and pinned for it once, then reused, so no pinning happens on the
 * hot path. On CUDA the device reads and writes it through the same pointer (mapped) and copies
 * to and from it run asynchronously. At least `size` bytes; NULL for 0 and on error
 * (STOWAGE_ERROR_OUT_OF_MEMORY when the system refuses pages, or for a size no host has). The
 * pool does not order reuse by streams: give a buffer back only once the copies and kernels that
 * use it are done. In a process forked from one that used the C ABI, this and every other host
 * pool entry point fail with STOWAGE_ERROR_DEVICE, as the allocator's do. */
void* stowage_host_malloc(ssize_t size, int device);
/* Gives back memory from stowage_host_malloc of the same device; NULL is a no-op. 0, or -1
 * (changing nothing) for a pointer the pool did not give or gave back already. */
int stowage_host_free(void* ptr, int device);
/* The same memory as a contiguous tensor (kDLCPU data), as stowage_dlpack_empty gives device
 * memory: its deleter gives it back to the pool. NULL on error. */
struct DLManagedTensor* stowage_dlpack_host_empty(int device, const int64_t* shape, int ndim, uint8_t code,
                                                  uint8_t bits);
/* The address `device`'s kernels use for the pool buffer at `ptr` (a buffer's start): on CUDA the
 * same pointer where the GPU addresses registered host memory by its host pointer (H100 on
 * x86-64 Linux does; CUDA does not promise it everywhere), else its mapped alias. NULL on error
 * (a pointer the pool did not give; STOWAGE_ERROR_UNSUPPORTED when the device gives none). */
void* stowage_host_device_pointer(void* ptr, int device);
/* The host pool's statistics as JSON (backend, pinned_bytes, in_use_bytes, requested_bytes, their
 * peaks, live_buffers, counts, numa_bound, per-node bytes) into buf, as stowage_get_stats. */
ssize_t stowage_host_stats(int device, char* buf, size_t len);
/* Unpins and unmaps the pool's pages that no live buffer uses; the bytes given back, or -1. */
ssize_t stowage_host_release_unused(int device);

/* Number of devices the ordinals above may name; -1 on error (e.g. a malformed STOWAGE_*). */
int stowage_device_count(void);

/* 1 when the ordinals name CUDA devices, 0 when they name emulated devices (host memory),
 * -1 on error. */
int stowage_using_cuda(void);

/* BF16/FP32 shared storage on host memory (docs/precision.md). An fp32 master of `numel` elements
 * is kept as two 16-bit planes: bf16[i], the bf16 value compute reads, and residual[i]; with
 * STOWAGE_ROUND_NEAREST_EVEN also bit i % 8 of ties[i / 8] (then bf16 is IEEE round-to-nearest-
 * even; STOWAGE_ROUND_HALF_UP needs no ties). Lossless: merge gives back every fp32 bit pattern.
 * The pointers are host memory (a CPU tensor's data); bf16 and residual 2-byte aligned, fp32
 * arrays 4-byte aligned. */
enum stowage_rounding { STOWAGE_ROUND_HALF_UP = 0, STOWAGE_ROUND_NEAREST_EVEN = 1 };
struct stowage_split_planes {
  uint16_t* bf16;
  uint16_t* residual;
  uint8_t* ties; /* NULL with STOWAGE_ROUND_HALF_UP */
  size_t numel;
  int rounding; /* enum stowage_rounding */
};

/* src (numel fp32) into the planes; the planes into dst (numel fp32). 0, or -1 on error. */
int stowage_split(const float* src, const struct stowage_split_planes* dst);
int stowage_merge(const struct stowage_split_planes* src, float* dst);

/* 1 when any of n gradients (grad_bits 32: fp32, 16: bf16) is Inf or NaN, 0 when none, -1 on error. */
int stowage_any_nonfinite(const void* grad, int grad_bits, size_t n);

/* Fused optimizer steps on the planes, in place: each element is merged to fp32 in registers,
 * updated and split again, in the operation order of docs/precision.md, so the master is bit-
 * identical to a plain fp32 optimizer doing the same float operations. grad: numel values of
 * grad_bits 32 or 16 (bf16); g = grad * (1 / loss_scale) * clip_coef. *step is the number of steps
 * applied so far; it is incremented when the step is applied. With skip_nonfinite, a non-finite
 * gradient skips the step and writes nothing. Returns 1 (applied), 0 (skipped) or -1 (error,
 * nothing written); hyper-parameters PyTorch's optimizers refuse (lr, eps, weight_decay, momentum
 * negative or not finite, a beta outside [0, 1), Nesterov without momentum or with dampening)
 * are STOWAGE_ERROR_INVALID_ARGUMENT. */
struct stowage_grad_scaling {
  float loss_scale;
  float clip_coef;
  int skip_nonfinite;
};
struct stowage_adam_options {
  float lr, beta1, beta2, eps, weight_decay;
  int decoupled_weight_decay; /* 1: AdamW; 0: Adam's L2 term g += wd * p */
};
struct stowage_sgd_options {
  float lr, momentum, dampening, weight_decay;
  int nesterov;
};
int stowage_adam_step(const struct stowage_split_planes* weights, const void* grad, int grad_bits, float* m, float* v,
                      const struct stowage_adam_options* options, const struct stowage_grad_scaling* scaling,
                      int64_t* step);
/* momentum_buffer (numel fp32) may be NULL when momentum is 0. */
int stowage_sgd_step(const struct stowage_split_planes* weights, const void* grad, int grad_bits,
                     float* momentum_buffer, const struct stowage_sgd_options* options,
                     const struct stowage_grad_scaling* scaling, int64_t* step);

/* The same steps on planes in the memory of `device` (a C ABI ordinal: a CUDA tensor's data on a
 * CUDA device, an emulated device's blocks), queued on `stream` of that device with its backend's
 * kernels. With skip_nonfinite the finite check runs on the stream first and the call waits for
 * it; otherwise it returns once the update is queued (the stream orders it before later work).
 * Same return values as above. */
int stowage_adam_step_async(int device, void* stream, const struct stowage_split_planes* weights, const void* grad,
                            int grad_bits, float* m, float* v, const struct stowage_adam_options* options,
                            const struct stowage_grad_scaling* scaling, int64_t* step);
int stowage_sgd_step_async(int device, void* stream, const struct stowage_split_planes* weights, const void* grad,
                           int grad_bits, float* momentum_buffer, const struct stowage_sgd_options* options,
                           const struct stowage_grad_scaling* scaling, int64_t* step);

/* Many tensors in one call (a framework's parameter group, a model's gradients): each tensor its
 * planes, gradient, state and step count; one set of options and scaling for all. */
struct stowage_step_tensor {
  struct stowage_split_planes weights;
  const void* grad;
  int grad_bits; /* 32: fp32, 16: bf16 */
  float* state0; /* Adam: m (exp_avg); SGD: the momentum buffer (NULL without momentum) */
  float* state1; /* Adam: v (exp_avg_sq); SGD: unused */
  int64_t step;  /* steps applied so far; incremented when the step is applied */
};

/* 1 when any gradient of the n tensors is Inf or NaN, 0 when none, -1 on error (only grad,
 * grad_bits and weights.numel are read). _async: gradients in the memory of `device`, one check
 * each queued on `stream` into `flag`, one wait for all. flag: one int of that device's memory the
 * check may overwrite (a framework's own, so stowage's allocator is not needed), or NULL for one
 * from stowage's allocator of the device. */
int stowage_any_nonfinite_multi(size_t n, const struct stowage_step_tensor* tensors);
int stowage_any_nonfinite_multi_async(int device, void* stream, size_t n, const struct stowage_step_tensor* tensors,
                                      int* flag);

/* The fused steps of n tensors, each as the one-tensor step above makes it, with one decision
 * for all: with skip_nonfinite, an Inf or NaN in any gradient skips every tensor's step. Every
 * tensor is checked before anything is written or queued. 1 (applied), 0 (skipped) or -1 (error,
 * nothing written). _async queues them on `stream` and returns (after waiting for the finite
 * check when it runs). */
int stowage_adam_step_multi(size_t n, struct stowage_step_tensor* tensors, const struct stowage_adam_options* options,
                            const struct stowage_grad_scaling* scaling);
int stowage_sgd_step_multi(size_t n, struct stowage_step_tensor* tensors, const struct stowage_sgd_options* options,
                           const struct stowage_grad_scaling* scaling);
int stowage_adam_step_multi_async(int device, void* stream, size_t n, struct stowage_step_tensor* tensors,
                                  const struct stowage_adam_options* options,
                                  const struct stowage_grad_scaling* scaling);
int stowage_sgd_step_multi_async(int device, void* stream, size_t n, struct stowage_step_tensor* tensors,
                                 const struct stowage_sgd_options* options, const struct stowage_grad_scaling* scaling);

/* Waits until the work queued on `stream` of `device` has finished. 0, or -1 on error. */
int stowage_synchronize(int device, void* stream);

/* The calling thread's last error message, "" when the last call succeeded. Valid until the
 * thread's next stowage call. */
const char* stowage_last_error(void);

/* What kind of error the calling thread's last call had. */
enum stowage_error_code {
  STOWAGE_OK = 0,
  STOWAGE_ERROR_INVALID_ARGUMENT = 1, /* bad pointer, negative size, device, stream, double free */
  STOWAGE_ERROR_OUT_OF_MEMORY = 2,    /* the device, the host or the memory cap refused a size */
  STOWAGE_ERROR_CONFIG = 3,           /* a malformed STOWAGE_* variable or file */
  STOWAGE_ERROR_UNSUPPORTED = 4,
  STOWAGE_ERROR_DEVICE = 5, /* the device or driver failed, or a call in a forked child */
  STOWAGE_ERROR_OTHER = 6
};
int stowage_last_error_code(void);

#ifdef __cplusplus
}
#endif

#endif /* STOWAGE_STOWAGE_H */
