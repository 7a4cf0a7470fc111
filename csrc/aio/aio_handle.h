// aio_handle: the DeepNVMe handle.  Each request is split into intra_op_parallelism slices that
// a pool of persistent worker threads moves concurrently (aio_io.h); async calls return at once
// and wait() joins everything queued since the last wait().
#pragma once

#include <torch/extension.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "aio_io.h"

namespace ds_aio {

// One request: its tensors stay referenced here until wait() so the memory outlives the I/O.
struct Op {
    bool is_read;
    std::string filename;
    std::int64_t file_offset;
    torch::Tensor user;  // the caller's tensor
    torch::Tensor host;  // what the workers touch (== user for contiguous CPU tensors)
    bool validate;
    std::mutex mu;
    std::condition_variable cv;
    int remaining = 0;
    std::string error;
};

class AioHandle {
public:
    AioHandle(std::int64_t block_size, int queue_depth, bool single_submit, bool overlap_events,
              int intra_op_parallelism);
    ~AioHandle();

    std::int64_t get_block_size() const { return cfg_.block_size; }
    int get_queue_depth() const { return cfg_.queue_depth; }
    bool get_single_submit() const { return cfg_.single_submit; }
    bool get_overlap_events() const { return cfg_.overlap_events; }
    int get_intra_op_parallelism() const { return threads_; }
    std::int64_t get_alignment() const { return kDirectAlign; }

    int submit(const torch::Tensor& buffer, const std::string& filename, bool is_read,
               bool validate, bool async_op, std::int64_t file_offset);
    int wait();

    torch::Tensor new_cpu_locked_tensor(std::int64_t num_elem, const torch::Tensor& example);
    bool free_cpu_locked_tensor(const torch::Tensor& t);
    bool is_pinned(const torch::Tensor& t) const;

private:
    void worker_loop();
    void finish(Op& op);  // joins one op; throws its error

    IoConfig cfg_;
    int threads_;
    std::vector<std::thread> workers_;
    std::mutex qmu_;
    std::condition_variable qcv_;
    std::deque<std::function<void()>> queue_;
    bool stop_ = false;
    std::vector<std::shared_ptr<Op>> pending_;
    // Buffers from new_cpu_locked_tensor still alive; shared with their deleters so a freed
    // address leaves the set even when the handle is gone first.
    struct LockedSet {
        std::mutex mu;
        std::unordered_set<const void*> ptrs;
    };
    std::shared_ptr<LockedSet> locked_ = std::make_shared<LockedSet>();
};

}  // namespace ds_aio
