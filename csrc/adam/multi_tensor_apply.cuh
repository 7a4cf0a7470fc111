// Multi-tensor apply: one kernel launch updates many tensors. The host splits every tensor into
// chunks of `chunk_size` elements and fills a table of (tensor pointers, size) slots plus a
// block -> (slot, chunk) map; the table travels by value as a kernel argument (under the 4 KiB
// parameter limit), so a launch needs no device allocation. A full table is launched and refilled,
// carrying over the tensor whose chunks did not all fit.
#pragma once

#include <cstdint>

#include "ds_cuda_compat.h"

namespace ds_optim {

constexpr int kMaxBlocksPerLaunch = 320;
constexpr int kThreadsPerBlock = 512;

// Tensors per table, chosen so the table stays under the kernel-parameter limit for its depth.
template <int DEPTH>
struct TableCapacity {
    static constexpr int value = DEPTH <= 2 ? 64 : (DEPTH <= 4 ? 36 : 30);
};

template <int DEPTH>
struct ChunkTable {
    static constexpr int kMaxTensors = TableCapacity<DEPTH>::value;
    void* ptrs[DEPTH][kMaxTensors];
    int64_t sizes[kMaxTensors];
    int tensor_ids[kMaxTensors];  // index of the slot's tensor in the caller's whole list
    unsigned char block_slot[kMaxBlocksPerLaunch];
    int block_chunk[kMaxBlocksPerLaunch];
};

// Each block handles one chunk: `op(ptrs, offset, n, tensor_id)` where ptrs are the chunk's
// tensors' base pointers, elements [offset, offset + n) are the block's, and tensor_id indexes
// per-tensor outputs (norms, coefficients).
template <int DEPTH, typename Op>
__global__ void multi_tensor_kernel(ChunkTable<DEPTH> table, int64_t chunk_size, Op op) {
    const int slot = table.block_slot[blockIdx.x];
    const int64_t offset = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * chunk_size;
    const int64_t remaining = table.sizes[slot] - offset;
    const int64_t n = remaining < chunk_size ? remaining : chunk_size;
    void* ptrs[DEPTH];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) ptrs[d] = table.ptrs[d][slot];
    op(ptrs, offset, n, table.tensor_ids[slot]);
}

// lists[d][i] is the i-th tensor of list d (all lists have `num_tensors` entries, tensor i has
// sizes[i] elements in every list). Returns nullptr or the CUDA error of a failed launch.
template <int DEPTH, typename Op>
const char* multi_tensor_apply(int64_t chunk_size, int num_tensors, void* const* const* lists,
                               const int64_t* sizes, cudaStream_t stream, const Op& op) {
    using Table = ChunkTable<DEPTH>;
    Table table;
    int slots = 0;
    int blocks = 0;
    auto launch = [&]() -> const char* {
        if (blocks > 0) {
            multi_tensor_kernel<DEPTH, Op>
                <<<blocks, kThreadsPerBlock, 0, stream>>>(table, chunk_size, op);
            const char* err = DS_CUDA_LAST_ERROR();
            if (err != nullptr) return err;
        }
        slots = 0;
        blocks = 0;
        return nullptr;
    };
    for (int i = 0; i < num_tensors; ++i) {
        if (sizes[i] == 0) continue;
        const int64_t chunks = (sizes[i] + chunk_size - 1) / chunk_size;
        int64_t chunk = 0;
        while (chunk < chunks) {
            for (int d = 0; d < DEPTH; ++d) table.ptrs[d][slots] = lists[d][i];
            table.sizes[slots] = sizes[i];
            table.tensor_ids[slots] = i;
            for (; chunk < chunks && blocks < kMaxBlocksPerLaunch; ++chunk, ++blocks) {
                table.block_slot[blocks] = static_cast<unsigned char>(slots);
                table.block_chunk[blocks] = static_cast<int>(chunk);
            }
            ++slots;
            if (blocks == kMaxBlocksPerLaunch || slots == Table::kMaxTensors) {
                const char* err = launch();
                if (err != nullptr) return err;
            }
        }
    }
    return launch();
}

}  // namespace ds_optim
