// Multi-tensor apply: one kernel launch updates many tensors, its work split evenly over a grid
// that fills the GPU once (no second, partly idle wave).
//
// The host fills a table of (tensor pointers, size, start in the concatenation of all tensors)
// slots; the table travels by value as a kernel argument, so a launch needs no device allocation
// and no host-to-device copy. Built with CUDA 12.1+ for sm_70+ only (every arch in
// __CUDA_ARCH_LIST__), a kernel may take 32 KiB of arguments: a table then holds hundreds of
// tensors (620 for Adam's four lists), so a model's whole parameter list is usually one launch.
// Older toolkits or archs keep the 4 KiB limit (73 tensors per launch for Adam).
//
// The launch has as many blocks as the device keeps resident at once (SMs x occupancy), fewer
// for a small update (at least `min_share` elements a block). Block b takes elements
// [b*share, (b+1)*share) of the concatenation of the table's tensors, cut at tensor boundaries
// into segments; segment edges inside a tensor are rounded up to a multiple of kSegmentAlign
// elements (the neighbouring block rounds the same edge the same way), so a segment of an
// aligned tensor starts on a 16-byte boundary and the op can use 16-byte loads. The op is
// called once per segment: `op(ptrs, offset, n, tensor_id)` where ptrs are the tensor's base
// pointers (one per list), elements [offset, offset + n) are the block's, and tensor_id indexes
// per-tensor outputs (norms, coefficients). Every thread of the block calls it with the same
// arguments, so an op may synchronise the block.
#pragma once

#include <cstdint>

#include "ds_cuda_compat.h"

namespace ds_optim {

constexpr int kThreadsPerBlock = 512;
// Blocks per SM the kernels are compiled for (at most 64 registers per thread): two resident
// blocks keep twice the loads in flight of one, which a memory-bound update needs more than
// registers.
constexpr int kMinBlocksPerSm = 2;
// Segment edges inside a tensor are multiples of this many elements: 8 bf16/fp16 elements or
// 4 fp32 ones fill 16 bytes, so 8 keeps every element type's vectors aligned.
constexpr int64_t kSegmentAlign = 8;

// Whether every arch this translation unit is compiled for may take 32 KiB of kernel
// arguments (CUDA 12.1+, Volta+). The same answer in the host and device passes, so the table
// type the host fills is the one the kernel reads.
#if defined(__CUDA_ARCH_LIST__)
constexpr int kArchList[] = {__CUDA_ARCH_LIST__};
constexpr int min_arch(int i = 0) {
    return i + 1 == static_cast<int>(sizeof(kArchList) / sizeof(int))
               ? kArchList[i]
               : (kArchList[i] < min_arch(i + 1) ? kArchList[i] : min_arch(i + 1));
}
constexpr bool kLargeKernelParams = CUDART_VERSION >= 12010 && min_arch() >= 700;
#else
constexpr bool kLargeKernelParams = false;
#endif

// Bytes of kernel arguments the table may use, leaving room for the op's own fields.
constexpr int kTableBytes = kLargeKernelParams ? 32764 - 512 : 4096 - 256;

template <int DEPTH>
struct ChunkTable {
    // ptrs + size + start + tensor id per slot, one more start for the end
    static constexpr int kMaxTensors = (kTableBytes - 8) / (8 * DEPTH + 8 + 8 + 4);
    void* ptrs[DEPTH][kMaxTensors];
    int64_t sizes[kMaxTensors];
    int64_t starts[kMaxTensors + 1];  // prefix sums of sizes: starts[slots] is the total
    int tensor_ids[kMaxTensors];      // index of the slot's tensor in the caller's whole list
    int slots;
};

DS_HD int64_t round_up(int64_t value, int64_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
}

// Block `block`'s part of a launch: elements [block*share, (block+1)*share) of the
// concatenation of the table's tensors, one op call per tensor segment (see the top). Host
// and device code, so tests/op_builder's host harness can run it block by block on a CPU.
template <int DEPTH, typename Op>
DS_HD void run_block(const ChunkTable<DEPTH>& table, int64_t share, int64_t block, const Op& op) {
    const int64_t total = table.starts[table.slots];
    const int64_t begin = block * share;
    const int64_t end = begin + share < total ? begin + share : total;
    if (begin >= end) return;
    // the slot holding element `begin`: the last one starting at or before it
    int lo = 0, hi = table.slots - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table.starts[mid] <= begin) lo = mid; else hi = mid - 1;
    }
    for (int slot = lo; slot < table.slots && table.starts[slot] < end; ++slot) {
        const int64_t start = table.starts[slot], size = table.sizes[slot];
        // both blocks that share an edge inside a tensor round it up alike
        int64_t first = begin > start ? round_up(begin - start, kSegmentAlign) : 0;
        int64_t last = end < start + size ? round_up(end - start, kSegmentAlign) : size;
        if (first > size) first = size;
        if (last > size) last = size;
        if (first >= last) continue;
        void* ptrs[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) ptrs[d] = table.ptrs[d][slot];
        op(ptrs, first, last - first, table.tensor_ids[slot]);
    }
}

template <int DEPTH, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocksPerSm)
    multi_tensor_kernel(ChunkTable<DEPTH> table, int64_t share, Op op) {
    run_block(table, share, blockIdx.x, op);
}

// Fills tables from the lists and calls launch(table, share, blocks) for each: a full table,
// then the rest. `resident`: the most blocks a launch gets; `min_share`: the fewest elements
// a block is given, so a small update uses fewer blocks. lists[d][i] is the i-th tensor of
// list d (tensor i has sizes[i] elements in every list). Returns nullptr or launch's error.
template <int DEPTH, typename Launch>
const char* plan_launches(int64_t min_share, int64_t resident, int num_tensors,
                          void* const* const* lists, const int64_t* sizes, const Launch& launch) {
    using Table = ChunkTable<DEPTH>;
    Table table;
    table.slots = 0;
    table.starts[0] = 0;
    auto flush = [&]() -> const char* {
        const int64_t total = table.starts[table.slots];
        if (total > 0) {
            int64_t blocks = (total + min_share - 1) / min_share;
            if (blocks > resident) blocks = resident;
            const int64_t share = round_up((total + blocks - 1) / blocks, kSegmentAlign);
            const char* err = launch(table, share, (total + share - 1) / share);
            if (err != nullptr) return err;
        }
        table.slots = 0;
        table.starts[0] = 0;
        return nullptr;
    };
    for (int i = 0; i < num_tensors; ++i) {
        if (sizes[i] == 0) continue;
        const int s = table.slots;
        for (int d = 0; d < DEPTH; ++d) table.ptrs[d][s] = lists[d][i];
        table.sizes[s] = sizes[i];
        table.tensor_ids[s] = i;
        table.starts[s + 1] = table.starts[s] + sizes[i];
        table.slots = s + 1;
        if (table.slots == Table::kMaxTensors) {
            const char* err = flush();
            if (err != nullptr) return err;
        }
    }
    return flush();
}

// Blocks of this kernel the device keeps resident at once (asked once per kernel and device).
template <int DEPTH, typename Op>
int resident_blocks(const char** err) {
    static int cached[64] = {0};
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess && device < 64 && cached[device] > 0) return cached[device];
    int sms = 0, per_sm = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, multi_tensor_kernel<DEPTH, Op>,
                                                          kThreadsPerBlock, 0);
    if (e != cudaSuccess) {
        *err = cudaGetErrorString(e);
        return 0;
    }
    const int blocks = sms * (per_sm > 0 ? per_sm : 1);
    if (device < 64) cached[device] = blocks;
    return blocks;
}

// One or more launches of `op` over the lists (plan_launches), on `stream`. Returns nullptr or
// the CUDA error of a failed launch.
template <int DEPTH, typename Op>
const char* multi_tensor_apply(int64_t min_share, int num_tensors, void* const* const* lists,
                               const int64_t* sizes, cudaStream_t stream, const Op& op) {
    const char* err = nullptr;
    const int resident = resident_blocks<DEPTH, Op>(&err);
    if (err != nullptr) return err;
    return plan_launches<DEPTH>(
        min_share, resident, num_tensors, lists, sizes,
        [&](const ChunkTable<DEPTH>& table, int64_t share, int64_t blocks) -> const char* {
            multi_tensor_kernel<DEPTH, Op>
                <<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(table, share, op);
            return DS_CUDA_LAST_ERROR();
        });
}

}  // namespace ds_optim
