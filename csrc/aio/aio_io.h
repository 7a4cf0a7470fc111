// Block-level file I/O for one slice of a request, run on a worker thread.
//
// A slice is a contiguous [file_offset, file_offset + nbytes) range backed by host memory.
// It is moved in block_size chunks with up to queue_depth chunks in flight: through libaio
// (io_submit/io_getevents) when the extension was built with DS_AIO_LIBAIO, else through
// pread/pwrite loops.  Chunks whose buffer address, file offset and length are all multiples
// of kDirectAlign go through an O_DIRECT descriptor when the file system accepts one, so
// large aligned transfers bypass the page cache; everything else (unaligned tails, tmpfs)
// uses a buffered descriptor.  Both descriptors see the same file, and Linux keeps direct
// and buffered I/O coherent for the ranges they touch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ds_aio {

constexpr std::size_t kDirectAlign = 4096;

struct IoConfig {
    std::size_t block_size;
    int queue_depth;
    bool single_submit;
    bool overlap_events;
};

struct Slice {
    bool is_read;
    std::string filename;
    char* buffer;              // host memory for this slice
    std::int64_t file_offset;  // where the slice starts in the file
    std::size_t nbytes;
};

// Performs the slice; returns "" on success, else an error message naming the file.
std::string run_slice(const Slice& slice, const IoConfig& cfg);

// Which engine run_slice uses: "libaio" or "pthread-pread".
const char* backend_name();

}  // namespace ds_aio
