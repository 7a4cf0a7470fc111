// gds_handle: the DeepNVMe handle over NVIDIA GPUDirect Storage (cuFile).  CUDA tensors move
// straight between GPU memory and the file (cuFileRead/cuFileWrite); host tensors go through
// pread/pwrite, so the handle takes everything the aio handle takes.  Each request is split
// into intra_op_parallelism slices of whole blocks moved by one thread each; async calls return
// at once and wait() joins everything queued since the last wait().
#pragma once

#include <torch/extension.h>

#include <cufile.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ds_gds {

struct Config {
    std::int64_t block_size;
    int queue_depth;
    bool single_submit;
    bool overlap_events;
    int intra_op_parallelism;
};

// One request: its tensor stays referenced until wait() so the memory outlives the I/O.
struct Op {
    bool is_read;
    std::string filename;
    std::int64_t file_offset;
    torch::Tensor user;    // the caller's tensor
    torch::Tensor buffer;  // what the slices touch (== user when contiguous)
    bool validate;
    std::vector<std::future<std::string>> slices;  // "" or the slice's error
};

class GdsHandle {
public:
    // handle_bindings.h: tensors arrive as ATen tensors; each call runs without the GIL.
    using buffer_type = torch::Tensor;
    using call_guard = pybind11::call_guard<pybind11::gil_scoped_release>;

    GdsHandle(std::int64_t block_size, int queue_depth, bool single_submit, bool overlap_events,
              int intra_op_parallelism);
    ~GdsHandle();

    std::int64_t get_block_size() const { return cfg_.block_size; }
    int get_queue_depth() const { return cfg_.queue_depth; }
    bool get_single_submit() const { return cfg_.single_submit; }
    bool get_overlap_events() const { return cfg_.overlap_events; }
    int get_intra_op_parallelism() const { return cfg_.intra_op_parallelism; }
    std::int64_t get_alignment() const { return 4096; }

    int submit(const torch::Tensor& buffer, const std::string& filename, bool is_read,
               bool validate, bool async_op, std::int64_t file_offset);
    int wait();

    torch::Tensor new_cpu_locked_tensor(std::int64_t num_elem, const torch::Tensor& example);
    bool free_cpu_locked_tensor(const torch::Tensor& t);
    bool is_pinned(const torch::Tensor& t);

    // GPUDirect only: device buffers registered with cuFile (no bounce buffer inside cuFile)
    torch::Tensor new_pinned_device_tensor(std::int64_t num_elem, const torch::Tensor& example);
    bool free_pinned_device_tensor(const torch::Tensor& t);
    bool pin_device_tensor(const torch::Tensor& t);
    bool unpin_device_tensor(const torch::Tensor& t);

private:
    void finish(Op& op);  // joins one op; throws its first error

    Config cfg_;
    std::vector<std::unique_ptr<Op>> pending_;
    std::mutex mu_;
    std::unordered_set<const void*> host_locked_;
    std::unordered_map<const void*, torch::Tensor> device_pinned_;  // keeps them alive
};

std::string backend_name();

}  // namespace ds_gds
