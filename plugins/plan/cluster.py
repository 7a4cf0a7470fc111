"""The hardware a plan is made for: how many accelerators, how much memory, how fast they talk.

A plan is only as good as these numbers, so each preset says where its figures come from (the
vendors' published peak rates) and every one can be overridden by a flag. Bandwidths are
per-accelerator, one direction, in bytes/s: intra-node is the NVLink (or shared-memory) link,
inter-node the network card share of one accelerator.
"""
import os
from dataclasses import dataclass, replace

GB = 2**30


@dataclass(frozen=True)
class Cluster:
    """Accelerators and links. ``peak_flops`` is the dense bf16 tensor rate of one accelerator;
    ``mfu`` the fraction of it a well-tuned transformer step reaches (the roofline's ceiling is
    scaled by it, so estimated times are realistic rather than ideal)."""
    name: str
    nodes: int
    gpus_per_node: int
    gpu_memory: int  # bytes per accelerator
    host_memory: int  # bytes per node
    nvme: int  # bytes per node (0: no NVMe offload)
    intra_bw: float  # bytes/s per accelerator inside a node
    inter_bw: float  # bytes/s per accelerator between nodes
    intra_latency: float  # seconds per collective step
    inter_latency: float
    peak_flops: float
    mfu: float = 0.5
    nvme_bw: float = 5e9  # bytes/s per node
    memory_bw: float = 2e12  # bytes/s of one accelerator's own memory (the optimizer step's bound)
    host_memory_bw: float = 100e9  # bytes/s of a node's CPU memory (an offloaded step's bound)
    # seconds per micro-batch the roofline does not see (kernel launches, the framework's
    # Python): 0 in the presets; the autotuner measures it on its profiling run
    step_overhead_s: float = 0.0

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


CPU_CORE_FLOPS = 50e9  # fp32 FLOP/s of one core with AVX2 FMA, a round figure


def _this_machine(ranks=None):
    """This machine with ``ranks`` processes as its "accelerators" (default: one per core, at
    most 2): each gets an equal share of the cores' FLOPs and of the memory bandwidth."""
    import psutil

    memory = psutil.virtual_memory().total
    cores = os.cpu_count() or 1
    ranks = ranks or min(cores, 2)
    # gloo over loopback moves ~1-2 GB/s; a desktop's DRAM streams ~10 GB/s per core
    return Cluster(name="cpu-local", nodes=1, gpus_per_node=ranks, gpu_memory=memory // ranks,
                   host_memory=memory, nvme=0, intra_bw=1.5e9, inter_bw=1.5e9,
                   intra_latency=50e-6, inter_latency=50e-6,
                   peak_flops=CPU_CORE_FLOPS * max(cores / ranks, 1), mfu=0.3,
                   memory_bw=10e9 * max(cores / ranks, 1), host_memory_bw=10e9 * cores)


PRESETS = {
    # 8 x H100 SXM 80 GB: NVLink4 450 GB/s per direction per GPU, 8 x 400 Gb/s InfiniBand NDR
    # (one 50 GB/s card per GPU), 989 TFLOP/s dense bf16, HBM3 3.35 TB/s.
    "dgx-h100": dict(gpus_per_node=8, gpu_memory=80 * GB, host_memory=2048 * GB,
                     nvme=30 * 2**40, intra_bw=450e9, inter_bw=50e9, intra_latency=5e-6,
                     inter_latency=10e-6, peak_flops=989e12, memory_bw=3.35e12),
    # 8 x A100 SXM 80 GB: NVLink3 300 GB/s per direction, 8 x 200 Gb/s HDR, 312 TFLOP/s bf16,
    # HBM2e 2.0 TB/s (the 40 GB card: 1.55 TB/s).
    "dgx-a100": dict(gpus_per_node=8, gpu_memory=80 * GB, host_memory=1024 * GB,
                     nvme=15 * 2**40, intra_bw=300e9, inter_bw=25e9, intra_latency=5e-6,
                     inter_latency=10e-6, peak_flops=312e12, memory_bw=2.0e12),
    # 8 x A100 40 GB with 100 Gb/s Ethernet: a common cloud node.
    "a100-40g-eth": dict(gpus_per_node=8, gpu_memory=40 * GB, host_memory=1024 * GB, nvme=0,
                         intra_bw=300e9, inter_bw=1.5e9, intra_latency=5e-6,
                         inter_latency=30e-6, peak_flops=312e12, memory_bw=1.55e12),
}


def cluster(preset: str = "dgx-h100", nodes: int = 1, **overrides) -> Cluster:
    """A preset (``cpu-local`` reads this machine) with ``overrides`` (any ``Cluster`` field
    given as a value other than ``None``)."""
    if preset == "cpu-local":
        base = replace(_this_machine(overrides.get("gpus_per_node")), nodes=nodes)
    elif preset in PRESETS:
        base = Cluster(name=preset, nodes=nodes, **PRESETS[preset])
    else:
        raise ValueError(f"cluster preset {preset!r}: expected one of "
                         f"{', '.join(sorted(PRESETS) + ['cpu-local'])}")
    unknown = set(overrides) - set(Cluster.__dataclass_fields__)
    if unknown:
        raise ValueError(f"cluster: unknown field(s) {sorted(unknown)}")
    chosen = {key: value for key, value in overrides.items() if value is not None}
    result = replace(base, **chosen)
    if result.nodes < 1 or result.gpus_per_node < 1:
        raise ValueError(f"cluster: nodes and gpus_per_node must be >= 1, got "
                         f"{result.nodes} x {result.gpus_per_node}")
    return result
