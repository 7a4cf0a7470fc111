// aio_handle: the DeepNVMe handle.  Each request is split into intra_op_parallelism slices that
// a pool of persistent worker threads moves concurrently (aio_io.h); async calls return at once
// and wait() joins everything queued since the last wait().
//
// Why pybind11 and no <torch/extension.h>: tensors are reached through their Python methods
// (data_ptr, nbytes, is_contiguous, copy_), which the handle calls only while it holds the GIL,
// and locked host tensors are torch.frombuffer views of memory this op owns. The ATen headers
// made each of the two translation units a ~45 CPU s compile; without them the JIT build of the
// op takes seconds (like the CPU optimizer kernels, csrc/cpu/optim_common.h).
#pragma once

#include <pybind11/pybind11.h>

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

namespace py = pybind11;

// One request: its tensors stay referenced here until wait() so the memory outlives the I/O.
// `user` and `host` are Python objects: created, read and dropped only with the GIL held.
struct Op {
    bool is_read;
    std::string filename;
    std::int64_t file_offset;
    py::object user;  // the caller's tensor
    py::object host;  // what the workers touch (is user for contiguous CPU tensors)
    char* data = nullptr;  // host's bytes, read by the worker threads
    std::int64_t nbytes = 0;
    bool validate;
    std::mutex mu;
    std::condition_variable cv;
    int remaining = 0;
    std::string error;
};

// Page-aligned (and, where RLIMIT_MEMLOCK allows, mlock'ed) host memory behind a tensor from
// new_cpu_locked_tensor; exposed to torch.frombuffer through the buffer protocol, so the tensor
// keeps it alive and its last reference frees it.
struct LockedSet {
    std::mutex mu;
    std::unordered_set<const void*> ptrs;
};

struct LockedBuffer {
    LockedBuffer(std::size_t bytes, std::shared_ptr<LockedSet> set);
    ~LockedBuffer();
    LockedBuffer(const LockedBuffer&) = delete;
    LockedBuffer& operator=(const LockedBuffer&) = delete;

    void* data = nullptr;
    std::size_t bytes;    // what the tensor sees
    std::size_t rounded;  // what was allocated (a multiple of the O_DIRECT alignment)
    bool locked = false;
    std::shared_ptr<LockedSet> set;
};

// Registers LockedBuffer with the module (new_cpu_locked_tensor needs its Python type).
void bind_locked_buffer(py::module_& m);

class AioHandle {
public:
    // The tensor arguments are torch.Tensor objects; the methods are called with the GIL held
    // and release it themselves while they wait on I/O (bindings: handle_bindings.h).
    using buffer_type = py::object;
    using call_guard = py::call_guard<>;

    AioHandle(std::int64_t block_size, int queue_depth, bool single_submit, bool overlap_events,
              int intra_op_parallelism);
    ~AioHandle();

    std::int64_t get_block_size() const { return cfg_.block_size; }
    int get_queue_depth() const { return cfg_.queue_depth; }
    bool get_single_submit() const { return cfg_.single_submit; }
    bool get_overlap_events() const { return cfg_.overlap_events; }
    int get_intra_op_parallelism() const { return threads_; }
    std::int64_t get_alignment() const { return kDirectAlign; }

    int submit(const py::object& buffer, const std::string& filename, bool is_read,
               bool validate, bool async_op, std::int64_t file_offset);
    int wait();

    py::object new_cpu_locked_tensor(std::int64_t num_elem, const py::object& example);
    bool free_cpu_locked_tensor(const py::object& t);
    bool is_pinned(const py::object& t) const;

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
    // Buffers from new_cpu_locked_tensor still alive; shared with the buffers so a freed
    // address leaves the set even when the handle is gone first.
    std::shared_ptr<LockedSet> locked_ = std::make_shared<LockedSet>();
};

}  // namespace ds_aio
