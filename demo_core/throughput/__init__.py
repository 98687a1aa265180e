"""Step-time model: will packing pay off on this GPU? (docs/THROUGHPUT.md)

`predict_throughput` prices each collator's real batches on a named GPU (`gpus.GPUS`); `cpu_rates` measures this
machine's CPU and predicts a CPU burst's speedups for a prepared run.
"""

from demo_core.gpus import GPUS, Device, gpu
from demo_core.throughput.predict import predict_throughput
from demo_core.throughput.step_time import CALIBRATED, PARTS, SHRINKS_WITH_PACKING, Efficiencies

__all__ = ["CALIBRATED", "Device", "Efficiencies", "GPUS", "PARTS", "SHRINKS_WITH_PACKING", "gpu",
           "predict_throughput"]
