// See aio_handle.h.  Every method runs with the GIL held and releases it while it waits on I/O.
// The module's Python bindings (names and defaults follow the DeepNVMe tutorial) are at the end
// of this file, not in a translation unit of their own: each unit that includes pybind11 parses
// ~110,000 lines and instantiates its templates, ~13 CPU s apiece at -O3, and the two units
// shared everything but the module definition.
#include "aio_handle.h"
#include "handle_bindings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
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
    const std::size_t n = static_cast<std::size_t>(op.nbytes);
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
    if (done != n || std::memcmp(back.data(), op.data, n) != 0)
        return "async_io: validation failed: the " + std::to_string(n) + " bytes at file offset " +
               std::to_string(op.file_offset) + " of '" + op.filename + "' differ from the tensor";
    return "";
}

py::module_ torch_module() { return py::module_::import("torch"); }

const void* data_ptr_of(const py::object& tensor)
{
    return reinterpret_cast<const void*>(tensor.attr("data_ptr")().cast<std::uintptr_t>());
}

}  // namespace

LockedBuffer::LockedBuffer(std::size_t bytes_, std::shared_ptr<LockedSet> set_)
    : bytes(bytes_), set(std::move(set_))
{
    rounded = (std::max<std::size_t>(1, bytes) + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    if (posix_memalign(&data, kDirectAlign, rounded) != 0)
        throw std::runtime_error("new_cpu_locked_tensor: cannot allocate " + std::to_string(rounded) + " bytes");
    // mlock can fail under RLIMIT_MEMLOCK; the buffer is still aligned, so O_DIRECT still works.
    locked = mlock(data, rounded) == 0;
    std::lock_guard<std::mutex> lk(set->mu);
    set->ptrs.insert(data);
}

LockedBuffer::~LockedBuffer()
{
    {
        std::lock_guard<std::mutex> lk(set->mu);
        set->ptrs.erase(data);
    }
    if (locked) munlock(data, rounded);
    std::free(data);
}

void bind_locked_buffer(py::module_& m)
{
    py::class_<LockedBuffer>(m, "_LockedHostBuffer", py::buffer_protocol(),
                             "Aligned host memory behind new_cpu_locked_tensor's tensors")
        .def_buffer([](LockedBuffer& b) {
            return py::buffer_info(b.data, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                                   {static_cast<py::ssize_t>(b.bytes)}, {1});
        });
}

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

int AioHandle::submit(const py::object& buffer, const std::string& filename, bool is_read,
                      bool validate, bool async_op, std::int64_t file_offset)
{
    if (file_offset < 0) bad_value("async_io: file_offset must be >= 0, got " + std::to_string(file_offset));
    auto op = std::make_shared<Op>();
    op->is_read = is_read;
    op->filename = filename;
    op->file_offset = file_offset;
    op->validate = validate;
    op->user = buffer;
    const bool on_cpu = buffer.attr("device").attr("type").cast<std::string>() == "cpu";
    const bool direct = on_cpu && buffer.attr("is_contiguous")().cast<bool>();
    if (direct)
        op->host = buffer;
    else if (is_read)
        op->host = torch_module().attr("empty")(buffer.attr("shape"), py::arg("dtype") = buffer.attr("dtype"));
    else
        op->host = buffer.attr("to")("cpu").attr("contiguous")();
    op->data = reinterpret_cast<char*>(op->host.attr("data_ptr")().cast<std::uintptr_t>());
    op->nbytes = op->host.attr("nbytes").cast<std::int64_t>();
    const std::int64_t nbytes = op->nbytes;
    if (is_read) check_readable(filename, file_offset, nbytes);

    const std::int64_t block = static_cast<std::int64_t>(cfg_.block_size);
    std::int64_t per = (nbytes + threads_ - 1) / threads_;
    per = std::max<std::int64_t>(block, (per + block - 1) / block * block);
    std::vector<Slice> slices;
    char* base = op->data;
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
    std::string error;
    {
        py::gil_scoped_release nogil;
        {
            std::unique_lock<std::mutex> lk(op.mu);
            op.cv.wait(lk, [&] { return op.remaining == 0; });
        }
        error = op.error;
        if (error.empty() && op.validate) error = compare_with_file(op);
    }
    if (!error.empty()) throw std::runtime_error(error);
    if (op.is_read && !op.user.is(op.host)) op.user.attr("copy_")(op.host);
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

py::object AioHandle::new_cpu_locked_tensor(std::int64_t num_elem, const py::object& example)
{
    if (num_elem < 0) bad_value("new_cpu_locked_tensor: num_elem must be >= 0, got " + std::to_string(num_elem));
    py::object dtype = example.attr("dtype");
    if (num_elem == 0)  // torch.frombuffer takes no empty view; an empty tensor has no bytes to lock
        return torch_module().attr("empty")(0, py::arg("dtype") = dtype);
    const std::size_t bytes = num_elem * example.attr("element_size")().cast<std::size_t>();
    py::object memory = py::cast(new LockedBuffer(bytes, locked_), py::return_value_policy::take_ownership);
    return torch_module().attr("frombuffer")(memory, py::arg("dtype") = dtype, py::arg("count") = num_elem);
}

bool AioHandle::free_cpu_locked_tensor(const py::object& t)
{
    // The memory itself goes back when the last reference to the tensor dies (its buffer).
    const void* p = data_ptr_of(t);
    std::lock_guard<std::mutex> lk(locked_->mu);
    return locked_->ptrs.erase(p) > 0;
}

bool AioHandle::is_pinned(const py::object& t) const
{
    if (t.attr("is_pinned")().cast<bool>()) return true;
    const void* p = data_ptr_of(t);
    std::lock_guard<std::mutex> lk(locked_->mu);
    return locked_->ptrs.count(p) > 0;
}

}  // namespace ds_aio

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    namespace py = pybind11;
    using ds_aio::AioHandle;
    m.doc() = "DeepNVMe async I/O: moves raw tensor bytes to and from files";
    m.def("backend", &ds_aio::backend_name, "I/O engine in use: 'libaio' or 'pthread-pread'");

    py::class_<AioHandle> cls(m, "aio_handle",
                              "Handle for tensor <-> file I/O split across intra_op_parallelism threads");
    ds_io_bindings::bind_handle_methods<AioHandle>(cls);
    ds_aio::bind_locked_buffer(m);
}
