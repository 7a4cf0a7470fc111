// gds_handle: see gds_handle.h.  Needs libcufile and the CUDA runtime; built by GDSBuilder only
// where both exist (ds_report says why elsewhere).
#include "gds_handle.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ds_gds {

namespace {

std::string cufile_error(const char* what, CUfileError_t status)
{
    std::string msg = std::string(what) + " failed: " + CUFILE_ERRSTR(status.err);
    if (IS_CUDA_ERR(status)) msg += " (CUDA driver error " + std::to_string(status.cu_err) + ")";
    return msg;
}

void open_driver()
{
    static std::once_flag once;
    static std::string error;
    std::call_once(once, [] {
        CUfileError_t status = cuFileDriverOpen();
        if (status.err != CU_FILE_SUCCESS) error = cufile_error("cuFileDriverOpen", status);
    });
    if (!error.empty())
        throw std::runtime_error("gds_handle: " + error +
                                 "; use deepspeed.ops.aio.aio_handle (same API) instead");
}

// O_DIRECT where the file system takes it (cuFile's direct path needs it); without it cuFile
// runs in compatibility mode through the page cache.
int open_file(const std::string& filename, bool is_read)
{
    int flags = is_read ? O_RDONLY : (O_WRONLY | O_CREAT);
    int fd = ::open(filename.c_str(), flags | O_DIRECT, 0644);
    if (fd < 0 && errno == EINVAL) fd = ::open(filename.c_str(), flags, 0644);
    return fd;
}

std::string io_error(bool is_read, const std::string& filename, std::int64_t offset,
                     std::int64_t nbytes, const std::string& why)
{
    return std::string("gds_handle: ") + (is_read ? "read from '" : "write to '") + filename +
           "' failed at file offset " + std::to_string(offset) + " (" + std::to_string(nbytes) +
           " bytes): " + why;
}

// One slice: [buf_offset, buf_offset + nbytes) of the buffer <-> file bytes at file_offset.
std::string move_slice(bool is_read, std::string filename, char* base, bool on_device, int device,
                       std::int64_t buf_offset, std::int64_t nbytes, std::int64_t file_offset,
                       std::int64_t block)
{
    int fd = open_file(filename, is_read);
    if (fd < 0) return io_error(is_read, filename, file_offset, nbytes, std::strerror(errno));
    std::string error;
    CUfileHandle_t fh = nullptr;
    if (on_device) {
        cudaSetDevice(device);
        CUfileDescr_t descr;
        std::memset(&descr, 0, sizeof(descr));
        descr.handle.fd = fd;
        descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
        CUfileError_t status = cuFileHandleRegister(&fh, &descr);
        if (status.err != CU_FILE_SUCCESS)
            error = io_error(is_read, filename, file_offset, nbytes,
                             cufile_error("cuFileHandleRegister", status));
    }
    for (std::int64_t pos = 0; error.empty() && pos < nbytes;) {
        std::int64_t len = std::min(block, nbytes - pos);
        ssize_t n;
        if (on_device) {
            n = is_read ? cuFileRead(fh, base, len, file_offset + pos, buf_offset + pos)
                        : cuFileWrite(fh, base, len, file_offset + pos, buf_offset + pos);
        } else {
            char* p = base + buf_offset + pos;
            n = is_read ? ::pread(fd, p, len, file_offset + pos) : ::pwrite(fd, p, len, file_offset + pos);
        }
        if (n < 0) {
            std::string why = (on_device && IS_CUFILE_ERR(n)) ? CUFILE_ERRSTR(n)
                                                              : std::strerror(on_device ? -n : errno);
            error = io_error(is_read, filename, file_offset + pos, len, why);
        } else if (n == 0) {
            error = io_error(is_read, filename, file_offset + pos, len, "unexpected end of file");
        } else {
            pos += n;
        }
    }
    if (fh != nullptr) cuFileHandleDeregister(fh);
    ::close(fd);
    return error;
}

void check_readable(const std::string& filename, std::int64_t offset, std::int64_t nbytes)
{
    struct stat st;
    if (::stat(filename.c_str(), &st) != 0)
        throw std::invalid_argument("gds_handle: cannot read '" + filename + "': " + std::strerror(errno));
    if (st.st_size < offset + nbytes)
        throw std::invalid_argument("gds_handle: file '" + filename + "' holds " +
                                    std::to_string(st.st_size) + " bytes, but reading " +
                                    std::to_string(nbytes) + " bytes at file offset " +
                                    std::to_string(offset) + " needs " + std::to_string(offset + nbytes));
}

}  // namespace

std::string backend_name() { return "cufile"; }

GdsHandle::GdsHandle(std::int64_t block_size, int queue_depth, bool single_submit,
                     bool overlap_events, int intra_op_parallelism)
    : cfg_{block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism}
{
    if (block_size <= 0 || queue_depth <= 0 || intra_op_parallelism <= 0)
        throw std::invalid_argument("gds_handle: block_size, queue_depth and intra_op_parallelism "
                                    "must be > 0");
    open_driver();
}

GdsHandle::~GdsHandle()
{
    for (auto& op : pending_)
        for (auto& f : op->slices) f.wait();
    for (auto& entry : device_pinned_) cuFileBufDeregister(entry.first);
}

int GdsHandle::submit(const torch::Tensor& user, const std::string& filename, bool is_read,
                      bool validate, bool async_op, std::int64_t file_offset)
{
    if (file_offset < 0) throw std::invalid_argument("gds_handle: file_offset must be >= 0");
    auto op = std::make_unique<Op>();
    op->is_read = is_read;
    op->filename = filename;
    op->file_offset = file_offset;
    op->validate = validate;
    op->user = user;
    op->buffer = user.is_contiguous() ? user : (is_read ? torch::empty_like(user).contiguous()
                                                        : user.contiguous());
    const std::int64_t nbytes = op->buffer.numel() * op->buffer.element_size();
    if (is_read) check_readable(filename, file_offset, nbytes);
    const bool on_device = op->buffer.is_cuda();
    const int device = on_device ? op->buffer.get_device() : -1;
    char* base = static_cast<char*>(op->buffer.data_ptr());
    std::int64_t per = (nbytes + cfg_.intra_op_parallelism - 1) / cfg_.intra_op_parallelism;
    per = std::max(cfg_.block_size, (per + cfg_.block_size - 1) / cfg_.block_size * cfg_.block_size);
    for (std::int64_t pos = 0; pos < std::max<std::int64_t>(nbytes, 1); pos += per) {
        op->slices.push_back(std::async(std::launch::async, move_slice, is_read, filename, base,
                                        on_device, device, pos, std::min(per, nbytes - pos),
                                        file_offset + pos, cfg_.block_size));
    }
    if (async_op) {
        pending_.push_back(std::move(op));
        return 0;
    }
    finish(*op);
    return 1;
}

void GdsHandle::finish(Op& op)
{
    std::string first;
    for (auto& f : op.slices) {
        std::string error = f.get();
        if (first.empty()) first = error;
    }
    if (!first.empty()) throw std::runtime_error(first);
    if (op.validate) {
        torch::Tensor host = op.buffer.to(torch::kCPU).contiguous();
        const std::int64_t nbytes = host.numel() * host.element_size();
        std::vector<char> back(nbytes);
        int fd = ::open(op.filename.c_str(), O_RDONLY);
        ssize_t got = fd < 0 ? -1 : ::pread(fd, back.data(), nbytes, op.file_offset);
        if (fd >= 0) ::close(fd);
        if (got != nbytes || std::memcmp(back.data(), host.data_ptr(), nbytes) != 0)
            throw std::runtime_error("gds_handle: validation failed: the " + std::to_string(nbytes) +
                                     " bytes at file offset " + std::to_string(op.file_offset) +
                                     " of '" + op.filename + "' differ from the tensor");
    }
    if (op.is_read && !op.user.is_same(op.buffer)) op.user.copy_(op.buffer);
}

int GdsHandle::wait()
{
    std::vector<std::unique_ptr<Op>> ops;
    ops.swap(pending_);
    std::string first;
    for (auto& op : ops) {
        try {
            finish(*op);
        } catch (const std::exception& e) {
            if (first.empty()) first = e.what();
        }
    }
    if (!first.empty()) throw std::runtime_error(first);
    return static_cast<int>(ops.size());
}

torch::Tensor GdsHandle::new_cpu_locked_tensor(std::int64_t num_elem, const torch::Tensor& example)
{
    if (num_elem < 0) throw std::invalid_argument("new_cpu_locked_tensor: num_elem must be >= 0");
    torch::Tensor t = torch::empty({num_elem}, example.options().device(torch::kCPU).pinned_memory(true));
    std::lock_guard<std::mutex> lock(mu_);
    host_locked_.insert(t.data_ptr());
    return t;
}

bool GdsHandle::free_cpu_locked_tensor(const torch::Tensor& t)
{
    std::lock_guard<std::mutex> lock(mu_);
    return host_locked_.erase(t.data_ptr()) > 0;
}

bool GdsHandle::is_pinned(const torch::Tensor& t)
{
    std::lock_guard<std::mutex> lock(mu_);
    return host_locked_.count(t.data_ptr()) > 0 || device_pinned_.count(t.data_ptr()) > 0;
}

bool GdsHandle::pin_device_tensor(const torch::Tensor& t)
{
    if (!t.is_cuda() || !t.is_contiguous())
        throw std::invalid_argument("pin_device_tensor: needs a contiguous CUDA tensor");
    std::lock_guard<std::mutex> lock(mu_);
    if (device_pinned_.count(t.data_ptr())) return true;
    CUfileError_t status = cuFileBufRegister(t.data_ptr(), t.numel() * t.element_size(), 0);
    if (status.err != CU_FILE_SUCCESS)
        throw std::runtime_error("gds_handle: " + cufile_error("cuFileBufRegister", status));
    device_pinned_.emplace(t.data_ptr(), t);
    return true;
}

bool GdsHandle::unpin_device_tensor(const torch::Tensor& t)
{
    std::lock_guard<std::mutex> lock(mu_);
    auto it = device_pinned_.find(t.data_ptr());
    if (it == device_pinned_.end()) return false;
    cuFileBufDeregister(it->first);
    device_pinned_.erase(it);
    return true;
}

torch::Tensor GdsHandle::new_pinned_device_tensor(std::int64_t num_elem, const torch::Tensor& example)
{
    if (num_elem < 0) throw std::invalid_argument("new_pinned_device_tensor: num_elem must be >= 0");
    int device = 0;
    if (example.is_cuda()) {
        device = example.get_device();
    } else {
        cudaGetDevice(&device);
    }
    torch::Tensor t = torch::empty({num_elem}, example.options().device(torch::kCUDA, device));
    pin_device_tensor(t);
    return t;
}

bool GdsHandle::free_pinned_device_tensor(const torch::Tensor& t) { return unpin_device_tensor(t); }

}  // namespace ds_gds
