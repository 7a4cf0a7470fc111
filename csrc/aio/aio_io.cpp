// See aio_io.h for why the slice is split the way it is.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // O_DIRECT
#endif
#include "aio_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#ifdef DS_AIO_LIBAIO
#include <libaio.h>
#endif

namespace ds_aio {

namespace {

std::string describe(const Slice& s, std::int64_t off, std::size_t len, const std::string& why)
{
    return std::string("async_io: ") + (s.is_read ? "read from '" : "write to '") + s.filename +
           "' failed at file offset " + std::to_string(off) + " (" + std::to_string(len) +
           " bytes): " + why;
}

bool aligned(std::uintptr_t v) { return v % kDirectAlign == 0; }

// Owns the buffered and (optional) O_DIRECT descriptors of one slice.
struct Files {
    int buffered = -1;
    int direct = -1;
    ~Files()
    {
        if (buffered >= 0) close(buffered);
        if (direct >= 0) close(direct);
    }
};

struct Chunk {
    std::size_t pos;  // offset inside the slice
    std::size_t len;
    bool direct;
};

// Moves [pos, pos+len) with plain pread/pwrite, retrying short transfers and EINTR.
std::string blocking_io(const Slice& s, int fd, std::size_t pos, std::size_t len)
{
    std::size_t done = 0;
    while (done < len) {
        char* p = s.buffer + pos + done;
        off_t off = s.file_offset + static_cast<off_t>(pos + done);
        ssize_t r = s.is_read ? pread(fd, p, len - done, off) : pwrite(fd, p, len - done, off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return describe(s, off, len - done, std::strerror(errno));
        }
        if (r == 0) return describe(s, off, len - done, "unexpected end of file");
        done += static_cast<std::size_t>(r);
    }
    return "";
}

std::vector<Chunk> plan(const Slice& s, std::size_t block_size, bool direct_ok)
{
    std::vector<Chunk> chunks;
    for (std::size_t pos = 0; pos < s.nbytes; pos += block_size) {
        std::size_t len = std::min(block_size, s.nbytes - pos);
        bool direct = direct_ok && aligned(reinterpret_cast<std::uintptr_t>(s.buffer + pos)) &&
                      aligned(static_cast<std::uintptr_t>(s.file_offset + pos)) && aligned(len);
        chunks.push_back({pos, len, direct});
    }
    return chunks;
}

#ifdef DS_AIO_LIBAIO
// One kernel AIO context per worker thread, kept across requests: io_setup + io_destroy cost
// ~30 ms per request here (io_destroy waits for an RCU grace period), which made every small
// swap-file write of ZeRO-Offload slower than a plain pwrite. Destroyed when the thread exits.
struct ThreadContext {
    io_context_t ctx = 0;
    int depth = 0;
    ~ThreadContext() { reset(); }
    void reset()
    {
        if (ctx) io_destroy(ctx);
        ctx = 0;
        depth = 0;
    }
};

thread_local ThreadContext t_context;

int thread_context(int depth, io_context_t* out)
{
    if (t_context.ctx && t_context.depth != depth) t_context.reset();
    if (!t_context.ctx) {
        int rc = io_setup(depth, &t_context.ctx);
        if (rc < 0) {
            t_context.ctx = 0;
            return rc;
        }
        t_context.depth = depth;
    }
    *out = t_context.ctx;
    return 0;
}

void drop_thread_context() { t_context.reset(); }

std::string libaio_io(const Slice& s, const IoConfig& cfg, const Files& f,
                      const std::vector<Chunk>& chunks)
{
    const int depth = std::max(1, cfg.queue_depth);
    io_context_t ctx = 0;
    int rc = thread_context(depth, &ctx);
    if (rc < 0) return describe(s, s.file_offset, s.nbytes, std::string("io_setup: ") + std::strerror(-rc));

    std::vector<struct iocb> cbs(depth);
    std::vector<struct iocb*> batch;
    std::vector<struct io_event> events(depth);
    std::vector<int> free_slots;
    for (int i = depth - 1; i >= 0; --i) free_slots.push_back(i);
    std::vector<std::size_t> chunk_of(depth);
    std::size_t next = 0;
    int inflight = 0;
    std::string err;

    auto submit = [&](std::vector<struct iocb*>& v) {
        std::size_t sent = 0;
        while (sent < v.size()) {
            int n = io_submit(ctx, static_cast<long>(v.size() - sent), v.data() + sent);
            if (n == -EAGAIN || n == -EINTR) continue;
            if (n < 0) return std::string("io_submit: ") + std::strerror(-n);
            sent += static_cast<std::size_t>(n);
        }
        return std::string();
    };

    while ((next < chunks.size() && err.empty()) || inflight > 0) {
        batch.clear();
        while (err.empty() && next < chunks.size() && !free_slots.empty()) {
            int slot = free_slots.back();
            free_slots.pop_back();
            const Chunk& c = chunks[next];
            int fd = c.direct ? f.direct : f.buffered;
            off_t off = s.file_offset + static_cast<off_t>(c.pos);
            if (s.is_read)
                io_prep_pread(&cbs[slot], fd, s.buffer + c.pos, c.len, off);
            else
                io_prep_pwrite(&cbs[slot], fd, s.buffer + c.pos, c.len, off);
            cbs[slot].data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(slot));
            chunk_of[slot] = next++;
            ++inflight;
            batch.push_back(&cbs[slot]);
            if (cfg.single_submit) {
                std::string e = submit(batch);
                if (!e.empty()) {
                    err = describe(s, off, c.len, e);
                    --inflight;
                    free_slots.push_back(slot);
                }
                batch.clear();
            }
        }
        if (!batch.empty()) {
            std::string e = submit(batch);
            if (!e.empty()) {
                // Nothing in this batch is known to be queued only if the first submit failed;
                // io_submit reports partial progress, so the helper only fails before any send.
                err = describe(s, s.file_offset, s.nbytes, e);
                for (auto* cb : batch) free_slots.push_back(static_cast<int>(reinterpret_cast<std::uintptr_t>(cb->data)));
                inflight -= static_cast<int>(batch.size());
            }
        }
        if (inflight == 0) continue;
        // overlap_events refills the queue as each chunk lands; otherwise the whole batch drains.
        long min_nr = cfg.overlap_events ? 1 : inflight;
        int n = io_getevents(ctx, min_nr, depth, events.data(), nullptr);
        if (n == -EINTR) continue;
        if (n < 0) {
            err = describe(s, s.file_offset, s.nbytes, std::string("io_getevents: ") + std::strerror(-n));
            drop_thread_context();  // its queue may still hold our requests: never reuse it
            break;  // cannot reap: leaving the loop with I/O queued is unavoidable here
        }
        for (int i = 0; i < n; ++i) {
            int slot = static_cast<int>(reinterpret_cast<std::uintptr_t>(events[i].obj->data));
            const Chunk& c = chunks[chunk_of[slot]];
            long res = static_cast<long>(events[i].res);
            free_slots.push_back(slot);
            --inflight;
            if (!err.empty()) continue;
            off_t off = s.file_offset + static_cast<off_t>(c.pos);
            if (res < 0) {
                err = describe(s, off, c.len, std::strerror(static_cast<int>(-res)));
            } else if (static_cast<std::size_t>(res) < c.len) {
                // A short transfer finishes on the buffered descriptor (any alignment works there).
                err = blocking_io(s, f.buffered, c.pos + res, c.len - res);
            }
        }
    }
    return err;
}
#endif

}  // namespace

const char* backend_name()
{
#ifdef DS_AIO_LIBAIO
    return "libaio";
#else
    return "pthread-pread";
#endif
}

std::string run_slice(const Slice& s, const IoConfig& cfg)
{
    int flags = s.is_read ? O_RDONLY : (O_WRONLY | O_CREAT);
    Files f;
    f.buffered = open(s.filename.c_str(), flags, 0644);
    if (f.buffered < 0) return describe(s, s.file_offset, s.nbytes, std::strerror(errno));
    if (s.nbytes == 0) return "";

    bool may_direct = cfg.block_size % kDirectAlign == 0 &&
                      aligned(reinterpret_cast<std::uintptr_t>(s.buffer)) &&
                      aligned(static_cast<std::uintptr_t>(s.file_offset)) && s.nbytes >= kDirectAlign;
    if (may_direct) f.direct = open(s.filename.c_str(), flags | O_DIRECT, 0644);  // -1: fs refuses
    std::vector<Chunk> chunks = plan(s, cfg.block_size, f.direct >= 0);

#ifdef DS_AIO_LIBAIO
    return libaio_io(s, cfg, f, chunks);
#else
    for (const Chunk& c : chunks) {
        std::string e = blocking_io(s, c.direct ? f.direct : f.buffered, c.pos, c.len);
        if (!e.empty()) return e;
    }
    return "";
#endif
}

}  // namespace ds_aio
