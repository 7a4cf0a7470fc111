// See aio_handle.h.  The GIL is released by the bindings around every call that may block.
#include "aio_handle.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace ds_aio {

namespace {

[[noreturn]] void bad_value(const std::string& msg) { throw pybind11::value_error(msg); }

void check_readable(const std::string& filename, std::int64_t offset, std::int64_t nbytes)
{
    struct stat st;
    if (stat(filename.c_str(), &st) != 0)
        bad_value("async_io: cannot read '" + filename + "': " + std::strerror(errno));
    std::int64_t need = offset + nbytes;
    if (st.st_size < need)
        bad_value("async_io: file '" + filename + "' holds " + std::to_string(st.st_size) +
                  " bytes, but reading " + std::to_string(nbytes) + " bytes at file offset " +
                  std::to_string(offset) + " needs " + std::to_string(need));
}

// Compares the file range with the buffer after a validated op.
std::string compare_with_file(const Op& op)
{
    const std::size_t n = op.host.nbytes();
    int fd = open(op.filename.c_str(), O_RDONLY);
    if (fd < 0) return "async_io: validation cannot open '" + op.filename + "': " + std::strerror(errno);
    std::vector<char> back(n);
    std::size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, back.data() + done, n - done, op.file_offset + done);
        if (r <= 0) break;
        done += static_cast<std::size_t>(r);
    }
    close(fd);
    if (done != n || std::memcmp(back.data(), op.host.data_ptr(), n) != 0)
        return "async_io: validation failed: the " + std::to_string(n) + " bytes at file offset " +
               std::to_string(op.file_offset) + " of '" + op.filename + "' differ from the tensor";
    return "";
}

}  // namespace

AioHandle::AioHandle(std::int64_t block_size, int queue_depth, bool single_submit,
                     bool overlap_events, int intra_op_parallelism)
{
    if (block_size <= 0) bad_value("aio_handle: block_size must be > 0, got " + std::to_string(block_size));
    if (queue_depth <= 0) bad_value("aio_handle: queue_depth must be > 0, got " + std::to_string(queue_depth));
    if (intra_op_parallelism <= 0)
        bad_value("aio_handle: intra_op_parallelism must be > 0, got " + std::to_string(intra_op_parallelism));
    cfg_ = {static_cast<std::size_t>(block_size), queue_depth, single_submit, overlap_events};
    threads_ = intra_op_parallelism;
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

AioHandle::~AioHandle()
{
    // Ops still queued must finish before their tensors and this pool go away.
    for (auto& op : pending_) {
        std::unique_lock<std::mutex> lk(op->mu);
        op->cv.wait(lk, [&] { return op->remaining == 0; });
    }
    {
        std::lock_guard<std::mutex> lk(qmu_);
        stop_ = true;
    }
    qcv_.notify_all();
    for (auto& t : workers_) t.join();
}

void AioHandle::worker_loop()
{
    for (;;) {
        std::function<void()> task;
        {
            std::unique_lock<std::mutex> lk(qmu_);
            qcv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stop_ and drained
            task = std::move(queue_.front());
            queue_.pop_front();
        }
        task();
    }
}

int AioHandle::submit(const torch::Tensor& buffer, const std::string& filename, bool is_read,
                      bool validate, bool async_op, std::int64_t file_offset)
{
    if (file_offset < 0) bad_value("async_io: file_offset must be >= 0, got " + std::to_string(file_offset));
    auto op = std::make_shared<Op>();
    op->is_read = is_read;
    op->filename = filename;
    op->file_offset = file_offset;
    op->validate = validate;
    op->user = buffer;
    const bool direct = buffer.device().is_cpu() && buffer.is_contiguous();
    if (direct)
        op->host = buffer;
    else if (is_read)
        op->host = torch::empty(buffer.sizes(), buffer.options().device(torch::kCPU));
    else
        op->host = buffer.to(torch::kCPU).contiguous();
    const std::int64_t nbytes = static_cast<std::int64_t>(op->host.nbytes());
    if (is_read) check_readable(filename, file_offset, nbytes);

    const std::int64_t block = static_cast<std::int64_t>(cfg_.block_size);
    std::int64_t per = (nbytes + threads_ - 1) / threads_;
    per = std::max<std::int64_t>(block, (per + block - 1) / block * block);
    std::vector<Slice> slices;
    char* base = static_cast<char*>(op->host.data_ptr());
    // An empty write still creates the file, so it runs as one zero-byte slice.
    for (std::int64_t pos = 0; pos < std::max<std::int64_t>(nbytes, 1); pos += per)
        slices.push_back({is_read, filename, base + pos, file_offset + pos,
                          static_cast<std::size_t>(std::min(per, nbytes - pos))});
    op->remaining = static_cast<int>(slices.size());
    {
        std::lock_guard<std::mutex> lk(qmu_);
        for (const Slice& s : slices) {
            Op* raw = op.get();
            IoConfig cfg = cfg_;
            queue_.push_back([raw, s, cfg] {
                std::string e = run_slice(s, cfg);
                std::lock_guard<std::mutex> g(raw->mu);
                if (!e.empty() && raw->error.empty()) raw->error = e;
                if (--raw->remaining == 0) raw->cv.notify_all();
            });
        }
    }
    qcv_.notify_all();
    if (async_op) {
        pending_.push_back(op);
        return 0;
    }
    finish(*op);
    return 1;
}

void AioHandle::finish(Op& op)
{
    {
        std::unique_lock<std::mutex> lk(op.mu);
        op.cv.wait(lk, [&] { return op.remaining == 0; });
    }
    if (!op.error.empty()) throw std::runtime_error(op.error);
    if (op.validate) {
        std::string e = compare_with_file(op);
        if (!e.empty()) throw std::runtime_error(e);
    }
    if (op.is_read && !op.user.is_same(op.host)) op.user.copy_(op.host);
}

int AioHandle::wait()
{
    std::vector<std::shared_ptr<Op>> ops;
    ops.swap(pending_);
    std::string first_error;
    for (auto& op : ops) {
        try {
            finish(*op);
        } catch (const std::exception& e) {
            if (first_error.empty()) first_error = e.what();
        }
    }
    if (!first_error.empty()) throw std::runtime_error(first_error);
    return static_cast<int>(ops.size());
}

torch::Tensor AioHandle::new_cpu_locked_tensor(std::int64_t num_elem, const torch::Tensor& example)
{
    if (num_elem < 0) bad_value("new_cpu_locked_tensor: num_elem must be >= 0, got " + std::to_string(num_elem));
    const std::size_t bytes = std::max<std::size_t>(1, num_elem * example.element_size());
    const std::size_t rounded = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    void* p = nullptr;
    if (posix_memalign(&p, kDirectAlign, rounded) != 0)
        throw std::runtime_error("new_cpu_locked_tensor: cannot allocate " + std::to_string(rounded) + " bytes");
    // mlock can fail under RLIMIT_MEMLOCK; the buffer is still aligned, so O_DIRECT still works.
    const bool locked = mlock(p, rounded) == 0;
    {
        std::lock_guard<std::mutex> lk(locked_->mu);
        locked_->ptrs.insert(p);
    }
    auto deleter = [rounded, locked, set = locked_](void* q) {
        {
            std::lock_guard<std::mutex> lk(set->mu);
            set->ptrs.erase(q);
        }
        if (locked) munlock(q, rounded);
        std::free(q);
    };
    return torch::from_blob(p, {num_elem}, deleter, example.options().device(torch::kCPU));
}

bool AioHandle::free_cpu_locked_tensor(const torch::Tensor& t)
{
    // The memory itself goes back when the last reference to the tensor dies (its deleter).
    std::lock_guard<std::mutex> lk(locked_->mu);
    return locked_->ptrs.erase(t.data_ptr()) > 0;
}

bool AioHandle::is_pinned(const torch::Tensor& t) const
{
    std::lock_guard<std::mutex> lk(locked_->mu);
    return t.is_pinned() || locked_->ptrs.count(t.data_ptr()) > 0;
}

}  // namespace ds_aio
