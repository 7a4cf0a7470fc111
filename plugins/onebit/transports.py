"""Where the compressed bytes travel: ``deepspeed.comm`` or MPI (``comm_backend_name``).

A transport moves two things: the packed sign chunks (an all-to-all: chunk ``j`` of every rank
goes to rank ``j``) and small tensors every rank needs from every other (an all-gather: scales,
then the server's packed chunks). The 1-bit arithmetic (``deepspeed.onebit.compressed``) is the
same whichever transport carries it.

- ``"compressed"``, ``"nccl"``, ``"hccl"``: ``deepspeed.comm`` ``all_to_all_single`` + ``all_gather``
  over whatever process group is up (NCCL / HCCL on an accelerator, gloo on CPU). Upstream's
  ``nccl`` / ``hccl`` backends differ only in the packing kernel, so all three names map here and
  the accelerator decides the wire.
- ``"mpi"``: mpi4py over the MPI library the job was launched with (``pip install
  'deepspeed[1bit]'``; ``mpirun -np N`` or ``deepspeed --launcher openmpi|mpich``). With
  ``cuda_aware`` device buffers are handed to MPI directly; otherwise they are staged through host
  memory. Only for the data-parallel group of the whole world (not with pipeline stages).

Every transport counts the bytes it hands to the library (``bytes_sent``), per call, so tests and
the benchmark measure the payload instead of estimating it.
"""
import torch

from deepspeed import comm as dist

TORCH_BACKENDS = ("compressed", "nccl", "hccl")
MPI_BACKEND = "mpi"
BACKENDS = TORCH_BACKENDS + (MPI_BACKEND,)
INSTALL_HINT = ("pip install 'deepspeed[1bit]' (mpi4py and the MPICH library from PyPI), then "
                "launch with `mpirun -np N python train.py` or `deepspeed --launcher "
                "openmpi|mpich ...`")


class TorchCommTransport:
    """Collectives of ``deepspeed.comm`` on ``group`` (None: the world)."""

    name = "compressed"

    def __init__(self, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group=group)
        self.rank = dist.get_rank(group=group)
        self.bytes_sent = 0

    def all_to_all(self, send):
        """``send`` ``(P, m)``: row ``j`` goes to rank ``j``; returns ``(P, m)``, row ``i`` from
        rank ``i``."""
        send = send.contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        self.bytes_sent += send.numel() * send.element_size()
        return recv

    def all_gather(self, tensor):
        """``(P, *tensor.shape)``: every rank's ``tensor``, in rank order."""
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor, group=self.group)
        self.bytes_sent += tensor.numel() * tensor.element_size()
        return torch.stack(parts)


class MPITransport:
    """mpi4py's ``Alltoall`` / ``Allgather`` on ``MPI.COMM_WORLD``."""

    name = MPI_BACKEND

    def __init__(self, cuda_aware=False, group=None):
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise ImportError(f"optimizer.params.comm_backend_name 'mpi' needs mpi4py and an MPI "
                              f"library, which are not installed: {INSTALL_HINT}") from exc
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.cuda_aware = bool(cuda_aware)
        self.world_size = self.comm.Get_size()
        self.rank = self.comm.Get_rank()
        self.bytes_sent = 0
        expected = dist.get_world_size(group=group)
        if self.world_size != expected or self.rank != dist.get_rank(group=group):
            raise RuntimeError(
                f"comm_backend_name 'mpi' compresses over MPI.COMM_WORLD, which has "
                f"{self.world_size} rank(s) (this is MPI rank {self.rank}) while the data-parallel "
                f"group has {expected} (this is rank {dist.get_rank(group=group)}): launch every "
                f"rank with mpirun (or `deepspeed --launcher openmpi|mpich`), one data-parallel "
                f"group over the whole world (no pipeline or model parallelism), or use "
                f"comm_backend_name 'compressed'")

    def _buffers(self, send, recv_shape):
        """(send buffer, receive buffer, copy-back) for MPI: device memory itself when
        CUDA-aware, host copies otherwise."""
        device = send.device
        if device.type == "cpu" or self.cuda_aware:
            if device.type != "cpu":
                torch.cuda.synchronize(device)  # MPI reads the memory outside torch's streams
            recv = torch.empty(recv_shape, dtype=send.dtype, device=device)
            return send, recv, lambda r: r
        host = send.cpu()
        recv = torch.empty(recv_shape, dtype=send.dtype)
        return host, recv, lambda r: r.to(device)

    def _mpi(self, tensor):
        if tensor.device.type == "cpu":
            return tensor.numpy()
        return [tensor, self.MPI.BYTE]  # __cuda_array_interface__: CUDA-aware MPI reads it

    def all_to_all(self, send):
        send = send.contiguous()
        out, recv, back = self._buffers(send, tuple(send.shape))
        self.comm.Alltoall(self._mpi(out), self._mpi(recv))
        self.bytes_sent += send.numel() * send.element_size()
        return back(recv)

    def all_gather(self, tensor):
        tensor = tensor.contiguous()
        out, recv, back = self._buffers(tensor, (self.world_size,) + tuple(tensor.shape))
        self.comm.Allgather(self._mpi(out), self._mpi(recv))
        self.bytes_sent += tensor.numel() * tensor.element_size()
        return back(recv)


def make_transport(comm_backend_name, cuda_aware=False, group=None):
    """The transport for ``comm_backend_name`` (see the module docstring), or a clear error."""
    name = str(comm_backend_name).lower()
    if name in TORCH_BACKENDS:
        return TorchCommTransport(group=group)
    if name == MPI_BACKEND:
        return MPITransport(cuda_aware=cuda_aware, group=group)
    raise ValueError(f"optimizer.params.comm_backend_name: '{comm_backend_name}' is not a 1-bit "
                     f"communication backend; allowed: {', '.join(BACKENDS)}")
