"""The GPUs the step-time model (throughput/) and the planner know: dense peak FLOP/s per precision, memory bandwidth and size, interconnect.

Every number is the vendor's datasheet value for the dense (non-sparse) tensor rate; datasheets print the sparse
rate too, at twice the dense one, and it never applies to training. `source` is the page each number was read from.
Units: FLOP/s, bytes/s, bytes. NVLink and PCIe figures are the datasheets' totals over both directions; a ring
collective sends one way on each link at a time, so `link_bytes_per_s_each_way` halves them.

`bf16_flops` is the rate with FP32 accumulation (what training uses); where a card has no bf16 tensor cores (T4) it
is None and bf16 is refused. `tf32_flops` is the tensor rate for fp32 matmuls with TF32 enabled; `fp32_flops` the
plain CUDA-core rate.
"""

from __future__ import annotations

import dataclasses
import re

from demo_core.errors import DemoInputError

TERA = 1e12
GIGA = 1e9
GB = 1e9  # datasheets count memory in decimal gigabytes
GIB = 2 ** 30

# A node: the GPUs that reach each other over NVLink (or PCIe). Past one node the ring's slowest hop is the network.
GPUS_PER_NODE = 8
# Assumption, not a datasheet number: one 200 Gb/s InfiniBand HDR port per GPU, the usual A100/H100 cluster build
# (NVIDIA DGX A100 user guide: 8 single-port HDR ConnectX-6 for compute). 200 Gb/s = 25 GB/s each way.
NODE_NETWORK_BYTES_PER_S_EACH_WAY = 25 * GB


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    label: str
    bf16_flops: float | None
    fp16_flops: float
    tf32_flops: float | None
    fp32_flops: float
    memory_bytes_per_s: float
    memory_bytes: float
    link: str  # "nvlink" | "pcie": what GPUs of one node talk over
    link_bytes_per_s: float  # datasheet total, both directions
    source: str
    # A GPU runs kernels while the host queues the next ones: host time hides behind device time. A CPU does both
    # in one thread: they add up.
    host_overlaps: bool = True

    @property
    def link_bytes_per_s_each_way(self) -> float:
        return self.link_bytes_per_s / 2

    def peak_flops(self, precision: str) -> float:
        rates = {"bf16": self.bf16_flops, "fp16": self.fp16_flops, "tf32": self.tf32_flops, "fp32": self.fp32_flops}
        if precision not in rates:
            raise DemoInputError(f"precision must be one of {', '.join(rates)}, got {precision!r}")
        if rates[precision] is None:
            raise DemoInputError(f"{self.label} has no {precision} tensor cores; choose "
                                 f"{', '.join(name for name, rate in rates.items() if rate)}")
        return rates[precision]


_A100_DATASHEET = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"

GPUS: dict[str, Device] = {device.name: device for device in (
    # A100 SXM4: BF16/FP16 312 TFLOPS dense (624 sparse), TF32 156, FP32 19.5; 80GB HBM2e 2,039 GB/s, 40GB HBM2
    # 1,555 GB/s; NVLink 600 GB/s; PCIe Gen4 64 GB/s.
    Device("a100-80gb", "A100 80GB SXM", 312 * TERA, 312 * TERA, 156 * TERA, 19.5 * TERA, 2039 * GB, 80 * GB,
           "nvlink", 600 * GB, _A100_DATASHEET),
    Device("a100-40gb", "A100 40GB SXM", 312 * TERA, 312 * TERA, 156 * TERA, 19.5 * TERA, 1555 * GB, 40 * GB,
           "nvlink", 600 * GB, _A100_DATASHEET),
    # H100 SXM5: BF16/FP16 989 TFLOPS dense (1,979 sparse), TF32 494.5, FP32 67; 80GB HBM3 3.35 TB/s; NVLink 900 GB/s.
    Device("h100-sxm", "H100 SXM 80GB", 989 * TERA, 989 * TERA, 494.5 * TERA, 67 * TERA, 3350 * GB, 80 * GB,
           "nvlink", 900 * GB, _H100_DATASHEET),
    # H100 PCIe: BF16/FP16 756 TFLOPS dense (1,513 sparse), TF32 378, FP32 51; 80GB HBM2e 2.0 TB/s; PCIe Gen5 128 GB/s
    # (the NVLink bridge joins pairs only: a node's ring runs over PCIe).
    Device("h100-pcie", "H100 PCIe 80GB", 756 * TERA, 756 * TERA, 378 * TERA, 51 * TERA, 2000 * GB, 80 * GB,
           "pcie", 128 * GB, _H100_DATASHEET),
    # H200 SXM: the H100 SXM's compute, 141GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    Device("h200", "H200 SXM 141GB", 989 * TERA, 989 * TERA, 494.5 * TERA, 67 * TERA, 4800 * GB, 141 * GB,
           "nvlink", 900 * GB, "https://www.nvidia.com/en-us/data-center/h200/"),
    # L40S: BF16/FP16 (FP32 accumulate) 362.05 TFLOPS dense (733 sparse), TF32 183, FP32 91.6; 48GB GDDR6 864 GB/s;
    # PCIe Gen4 x16 64 GB/s, no NVLink.
    Device("l40s", "L40S 48GB", 362.05 * TERA, 362.05 * TERA, 183 * TERA, 91.6 * TERA, 864 * GB, 48 * GB,
           "pcie", 64 * GB, "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    # L4: BF16/FP16 121 TFLOPS dense (242 sparse), TF32 60, FP32 30.3; 24GB GDDR6 300 GB/s; PCIe Gen4 x16 64 GB/s.
    Device("l4", "L4 24GB", 121 * TERA, 121 * TERA, 60 * TERA, 30.3 * TERA, 300 * GB, 24 * GB,
           "pcie", 64 * GB, "https://www.nvidia.com/en-us/data-center/l4/"),
    # A10G (AWS G5; NVIDIA publishes no A10G datasheet): tensor BF16/FP16 70 TFLOPS dense, TF32 35, FP32 31.2;
    # 24GB GDDR6 600 GB/s; PCIe Gen4 x16 64 GB/s. Read from Baseten's A10 vs A10G comparison (AWS's instance specs).
    Device("a10g", "A10G 24GB", 70 * TERA, 70 * TERA, 35 * TERA, 31.2 * TERA, 600 * GB, 24 * GB,
           "pcie", 64 * GB, "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/"),
    # T4: FP16 tensor 65 TFLOPS (mixed precision), no BF16 tensor cores, no TF32; FP32 8.1; 16GB GDDR6 320 GB/s;
    # PCIe Gen3 x16 32 GB/s.
    Device("t4", "T4 16GB", None, 65 * TERA, None, 8.1 * TERA, 320 * GB, 16 * GB, "pcie", 32 * GB,
           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    # RTX 4090 (Ada whitepaper, appendix table): FP16/BF16 tensor with FP32 accumulate 165.2 TFLOPS dense (330.3
    # sparse; the FP16-accumulate rate is twice that and is not what training uses), TF32 82.6, FP32 82.6; 24GB GDDR6X
    # 1,008 GB/s; PCIe Gen4 x16 64 GB/s, no NVLink.
    Device("rtx-4090", "GeForce RTX 4090 24GB", 165.2 * TERA, 165.2 * TERA, 82.6 * TERA, 82.6 * TERA, 1008 * GB,
           24 * GB, "pcie", 64 * GB,
           "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
)}


def gpu(name: str) -> Device:
    """A GPU by its table name (case-insensitive)."""
    key = name.strip().lower()
    if key not in GPUS:
        raise DemoInputError(f"unknown GPU {name!r}; choose one of: {', '.join(GPUS)}")
    return GPUS[key]


def ring_bytes_per_s_each_way(device: Device, gpus: int) -> float:
    """The slowest hop of a ring over `gpus` of these: the node's links, or past one node the network."""
    within_node = device.link_bytes_per_s_each_way
    return within_node if gpus <= GPUS_PER_NODE else min(within_node, NODE_NETWORK_BYTES_PER_S_EACH_WAY)


GPU_NAMES = tuple(GPUS)

# What torch.cuda.get_device_name() calls each card (lower-cased), most specific first: "NVIDIA A100-SXM4-80GB",
# "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA L4", "Tesla T4", "NVIDIA GeForce RTX 4090". An A100 80GB
# PCIe card is priced as the SXM one (its bandwidth is 5% lower).
_DEVICE_NAME_PATTERNS = ((r"h200", "h200"), (r"h100.*pcie", "h100-pcie"), (r"h100", "h100-sxm"),
                         (r"a100.*80", "a100-80gb"), (r"a100", "a100-40gb"), (r"l40s", "l40s"), (r"\bl4\b", "l4"),
                         (r"a10g", "a10g"), (r"\bt4\b", "t4"), (r"4090", "rtx-4090"))


def gpu_for_device_name(device_name: str) -> Device | None:
    """The table's entry for a CUDA device name as torch reports it; None for a card the table does not have."""
    lowered = device_name.lower()
    return next((GPUS[name] for pattern, name in _DEVICE_NAME_PATTERNS if re.search(pattern, lowered)), None)
