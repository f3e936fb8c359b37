// The C ABI between the C++ shim and the Rust engine. crates/abi/src/lib.rs mirrors it, and
// abi_check.cpp checks at compile time that both lay it out alike.
// The shim encodes each aten call as an array of TtArg and gets back a TtResult.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum TtArgKind : uint8_t {
  TT_NONE = 0,
  TT_TENSOR = 1,
  TT_INT = 2,
  TT_FLOAT = 3,
  TT_BOOL = 4,
  TT_COMPLEX = 5,
  TT_INT_LIST = 6,
  TT_FLOAT_LIST = 7,
  TT_BOOL_LIST = 8,
  TT_TENSOR_LIST = 9,  // items are TT_TENSOR or TT_NONE (for Tensor?[])
  TT_STR = 10,
  TT_SCALAR_TYPE = 11,
  TT_GENERATOR = 12,   // i = seed, i2 = offset (already advanced by the shim)
  TT_OTHER = 13,       // layout, device, memory format: carried as i
};

// Tensor flags.
enum : uint8_t {
  TT_HOST = 1,            // a CPU tensor: `host` points at its contiguous data
  TT_WRAPPED_NUMBER = 2,  // a Python number wrapped as a 0-d tensor
};

typedef struct TtTensor {
  void* cell;  // the Rust storage cell (the storage's data pointer); null for host tensors
  const void* host;
  const int64_t* sizes;
  const int64_t* strides;
  int64_t offset;
  int32_t ndim;
  int8_t dtype;  // c10::ScalarType
  uint8_t flags;
} TtTensor;

typedef struct TtArg {
  uint8_t kind;
  union {
    TtTensor t;
    struct { int64_t i; int64_t i2; } n;
    double f;
    struct { double re, im; } c;
    struct { const void* ptr; size_t len; } list;  // int64_t / double / bool / TtArg / char
  };
} TtArg;

// A tensor, or a list header (i = item count) followed by its items. Number returns (bool,
// int, float in the schema) come back as 0-d tensors that the shim reads.
enum TtOutKind : uint8_t { TT_OUT_TENSOR = 0, TT_OUT_LIST = 1, TT_OUT_UNDEFINED = 2 };

typedef struct TtOut {
  uint8_t kind;
  int8_t dtype;
  int32_t ndim;
  const int64_t* sizes;
  void* cell;     // a new cell owned by the receiver (one reference)
  int64_t i;      // list length
} TtOut;

enum TtStatus : int32_t {
  TT_OK = 0,
  TT_ERR_RUNTIME = 1,
  TT_ERR_VALUE = 2,
  TT_ERR_TYPE = 3,
  TT_ERR_INDEX = 4,
  TT_ERR_NOT_IMPLEMENTED = 5,
  TT_RESIZE = 6,  // resize argument `resize_arg` to `outs[0]` sizes, then call again
  TT_ERR_NO_LOWERING = 7,  // NotImplementedError, or the CPU fallback when enabled
  TT_ERR_OUT_OF_MEMORY = 8,  // torch.OutOfMemoryError
};

typedef struct TtResult {
  int32_t status;
  int32_t resize_arg;
  const char* message;  // valid until the next call on this thread
  size_t nouts;
  const TtOut* outs;    // valid until the next call on this thread
} TtResult;

// Registers an operator once; returns its id. `arg_names` holds `nargs` NUL-separated names;
// `write_mask` has bit i set when argument i is written (alias annotation with `!`).
int32_t tt_op_register(const char* name, const char* overload, const char* arg_names,
                       int32_t nargs, uint64_t write_mask);
const TtResult* tt_op_call(int32_t op, const TtArg* args, size_t nargs);

// Storage cells. A tpu storage's DataPtr holds its cell as the context and, as the data
// pointer, an address of the cell's own range in a reserved region that faults on any access.
void* tt_cell_new(int64_t nbytes, int32_t device);
void* tt_cell_address(void* cell);      // null: too large for the region
void* tt_cell_at(const void* address);  // the cell of a data pointer; null if none
void tt_address_region(size_t* base, size_t* len);
void tt_cell_release(void* cell);
const TtResult* tt_cell_resize(void* cell, int64_t nbytes);
const TtResult* tt_cell_copy_bytes(void* dst, const void* src, int64_t nbytes);
const TtResult* tt_to_host(const TtTensor* src, void* dst, int64_t nbytes);
const TtResult* tt_from_host(const TtTensor* dst, const void* src, int64_t nbytes);
// Non-blocking copies to (from) host memory that stays valid (unchanged) until the copy is done:
// the engine calls release(ctx) then. torch.tpu.synchronize and Events wait for them.
const TtResult* tt_to_host_async(const TtTensor* src, void* dst, int64_t nbytes, void (*release)(void*), void* ctx);
const TtResult* tt_from_host_async(const TtTensor* dst, const void* src, int64_t nbytes, void (*release)(void*), void* ctx);
// Waits for the non-blocking copies that read or write host memory in [ptr, ptr + nbytes).
const TtResult* tt_host_wait(const void* ptr, int64_t nbytes);
// The memory history's notes of a storage's birth (or move or growth) and release.
void tt_history_alloc(void* cell, const void* address, size_t nbytes, int32_t device);
void tt_history_free(void* cell);

// Aten ops ("name" or "name.overload") whose composite kernels the fallback must override:
// NUL-separated, ending with an empty name.
const char* tt_routed_ops(void);
// Whether a structured aten op ("aten::add_", "Tensor") runs its lowering directly instead of
// its generated composite (it has a lowering, and its composite is not needed).
bool tt_route_structured(const char* qualified_name, const char* overload);
// Whether an op belongs to a family whose composite kernels (one op per list item) the shim
// replaces with the lowering (declared `.list_op()`).
bool tt_route_family(const char* qualified_name);

// Sets the float32 matmul precision of later programs, numbered as at::Float32MatmulPrecision
// (0 highest, 1 high, 2 medium); the engine keys its programs by it.
void tt_set_float32_matmul_precision(int32_t precision);
int32_t tt_device_count(void);
void tt_synchronize(int32_t device);

// A device's memory statistics (torch.tpu.memory_stats, torch.accelerator.memory_stats): each
// quantity's current value, peak, total increase and total decrease since the last reset.
typedef struct TtStat {
  int64_t current, peak, allocated, freed;
} TtStat;
typedef struct TtMemoryStats {
  TtStat buffers;   // live device buffers (one per storage that holds data)
  TtStat bytes;     // their bytes
  TtStat reserved;  // bytes the plugin's allocator holds, free or not
} TtMemoryStats;
void tt_memory_stats(int32_t device, TtMemoryStats* out);
void tt_memory_reset(int32_t device, bool peak, bool accumulated);
// (free, total) bytes of the device's memory; fails where the plugin does not say.
const TtResult* tt_memory_info(int32_t device, int64_t* free_bytes, int64_t* total_bytes);
bool tt_is_initialized(void);

// Device activity for torch.profiler (crates/engine/src/trace.rs): recording on or off, the
// profiler's correlation id of the aten call now running on this thread (0: none), and the
// compiles and programs run while recording, each given to `emit` (times in ns since the Unix
// epoch; host_thread is the compiling thread's id for a compile, -1 for a program).
void tt_trace_record(bool on);
void tt_trace_correlation(uint64_t id);
typedef void (*TtEmitActivity)(void* ctx, const char* name, int64_t name_len, int32_t device, int32_t host_thread,
                               uint64_t correlation, int64_t start_ns, int64_t end_ns);
void tt_trace_take(TtEmitActivity emit, void* ctx);

#ifdef __cplusplus
}
#endif
