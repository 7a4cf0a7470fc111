"""ZeRO-Offload helpers: keeping optimizer state off the accelerator (NVMe swapping in `nvme`)."""
