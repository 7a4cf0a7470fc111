"""The Megatron-style memory-mapped indexed dataset the data analyzer writes and the curriculum
sampler reads (upstream: ``deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset``).

A dataset ``prefix`` is two files: ``prefix.bin`` holds every item's values back to back, and
``prefix.idx`` says where each item starts:

    b"MMIDIDX\\x00\\x00"  <Q version=1  <B dtype code  <Q item count  <Q document count
    int32 sizes[count]  int64 byte pointers[count]  int64 document boundaries[documents]

The same layout as Megatron-LM, so files written here are readable by tools built for it and the
other way round. Both files are written to temporaries and renamed, so a crash never leaves a
half-written index under the final name.
"""
import os
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.double, 8: np.uint16, 9: np.uint32, 10: np.uint64}


def dtype_code(dtype):
    dtype = np.dtype(dtype)
    for code, candidate in DTYPES.items():
        if np.dtype(candidate) == dtype:
            return code
    allowed = sorted({np.dtype(d).name for d in DTYPES.values()})
    raise ValueError(f"indexed datasets cannot store dtype {dtype.name}; allowed: "
                     f"{', '.join(allowed)}")


def index_file_path(prefix):
    return prefix + ".idx"


def data_file_path(prefix):
    return prefix + ".bin"


def exists(prefix):
    return os.path.isfile(index_file_path(prefix)) and os.path.isfile(data_file_path(prefix))


class MMapIndexedDatasetBuilder:
    """Append items (1-D arrays or tensors), then ``finalize``; writes ``prefix.bin/.idx``."""

    def __init__(self, out_file, dtype=np.int64):
        """``out_file`` is the ``.bin`` path (upstream's signature) or the bare prefix."""
        self.prefix = out_file[:-4] if out_file.endswith(".bin") else out_file
        self.dtype = np.dtype(dtype)
        self.code = dtype_code(self.dtype)
        self._tmp_bin = data_file_path(self.prefix) + ".tmp"
        self._data = open(self._tmp_bin, "wb")
        self._sizes = []
        self._doc_idx = [0]

    def add_item(self, values):
        if hasattr(values, "detach"):
            values = values.detach().cpu().numpy()
        array = np.asarray(values, dtype=self.dtype).reshape(-1)
        self._data.write(array.tobytes(order="C"))
        self._sizes.append(array.size)

    def add_items(self, values, sizes):
        """Append ``len(sizes)`` items at once: ``values`` is their concatenation (one write,
        for the analyzer's millions of one-value items)."""
        array = np.asarray(values, dtype=self.dtype).reshape(-1)
        sizes = [int(s) for s in sizes]
        if sum(sizes) != array.size:
            raise ValueError(f"add_items: sizes sum to {sum(sizes)} but {array.size} values given")
        self._data.write(array.tobytes(order="C"))
        self._sizes.extend(sizes)

    def end_document(self):
        self._doc_idx.append(len(self._sizes))

    def merge_file_(self, another_prefix):
        """Append every item of another dataset of the same dtype (the reduce step)."""
        other = MMapIndexedDataset(another_prefix)
        if other.dtype != self.dtype:
            raise ValueError(f"cannot merge {another_prefix} ({other.dtype}) into "
                             f"{self.prefix} ({self.dtype})")
        for i in range(len(other)):
            self.add_item(other[i])

    def finalize(self, index_file=None):
        self._data.close()
        sizes = np.asarray(self._sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64)) * self.dtype.itemsize
        if self._doc_idx[-1] != len(sizes):
            self._doc_idx.append(len(sizes))
        tmp_idx = index_file_path(self.prefix) + ".tmp"
        with open(tmp_idx, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", self.code))
            f.write(struct.pack("<Q", len(sizes)))
            f.write(struct.pack("<Q", len(self._doc_idx)))
            f.write(sizes.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(np.asarray(self._doc_idx, dtype=np.int64).tobytes(order="C"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(self._tmp_bin, data_file_path(self.prefix))
        os.replace(tmp_idx, index_file_path(self.prefix))


class MMapIndexedDataset:
    """Read-only view of ``prefix.bin/.idx``: ``ds[i]`` is item ``i`` as a numpy array."""

    def __init__(self, path, skip_warmup=True):
        self.prefix = path
        for file in (index_file_path(path), data_file_path(path)):
            if not os.path.isfile(file):
                raise FileNotFoundError(f"indexed dataset file {file} does not exist (an indexed "
                                        f"dataset is the pair {path}.idx / {path}.bin written "
                                        f"by MMapIndexedDatasetBuilder or the DataAnalyzer)")
        with open(index_file_path(path), "rb") as f:
            magic = f.read(len(MAGIC))
            if magic != MAGIC:
                raise ValueError(f"{index_file_path(path)} is not an MMIDIDX index file "
                                 f"(magic {magic!r})")
            (version,) = struct.unpack("<Q", f.read(8))
            if version != VERSION:
                raise ValueError(f"{index_file_path(path)}: index version {version}, "
                                 f"only {VERSION} is supported")
            (code,) = struct.unpack("<B", f.read(1))
            if code not in DTYPES:
                raise ValueError(f"{index_file_path(path)}: unknown dtype code {code}")
            self.dtype = np.dtype(DTYPES[code])
            (count,) = struct.unpack("<Q", f.read(8))
            (docs,) = struct.unpack("<Q", f.read(8))
            offset = f.tell()
        index = np.memmap(index_file_path(path), mode="r", order="C")
        self.sizes = np.frombuffer(index, dtype=np.int32, count=count, offset=offset)
        self.pointers = np.frombuffer(index, dtype=np.int64, count=count,
                                      offset=offset + self.sizes.nbytes)
        self.doc_idx = np.frombuffer(index, dtype=np.int64, count=docs,
                                     offset=offset + self.sizes.nbytes + self.pointers.nbytes)
        self._index = index
        size = os.path.getsize(data_file_path(path))
        self._data = (np.memmap(data_file_path(path), mode="r", order="C") if size
                      else np.zeros(0, dtype=np.uint8))

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"index {idx} out of range for {self.prefix} ({len(self)} items)")
        return np.frombuffer(self._data, dtype=self.dtype, count=int(self.sizes[idx]),
                             offset=int(self.pointers[idx]))

    def get(self, idx, offset=0, length=None):
        item = self[idx]
        return item[offset:] if length is None else item[offset:offset + length]

    @staticmethod
    def exists(path):
        return exists(path)


def read_all(prefix):
    """Every item of a dataset as a list of arrays (small index files)."""
    ds = MMapIndexedDataset(prefix)
    return [np.array(ds[i]) for i in range(len(ds))]
