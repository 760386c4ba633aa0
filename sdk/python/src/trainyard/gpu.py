"""GPU utilisation from NVML (`pip install trainyard[gpu]`), when a GPU is present."""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

log = logging.getLogger("trainyard")


class GpuSampler:
    """Samples every visible GPU. Without nvidia-ml-py, or without a GPU, `sample()`
    returns an empty dict: the same script runs on a laptop."""

    def __init__(self) -> None:
        self._nvml: Optional[Any] = None
        self._handles: list = []
        try:
            import pynvml  # type: ignore[import-not-found]
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as error:  # NVMLError without a driver; never fatal
            log.info("trainyard: no GPU metrics (%s)", error)
            return
        self._nvml = pynvml

    @property
    def available(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def sample(self) -> Dict[str, float]:
        """`gpu_utilization_percent` (mean over devices) and `gpu_memory_used_fraction`
        (used over total, all devices)."""
        if not self.available:
            return {}
        nvml = self._nvml
        try:
            utilisation = [nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
            memory = [nvml.nvmlDeviceGetMemoryInfo(h) for h in self._handles]
        except Exception as error:  # a device lost mid-run must not stop training
            log.warning("trainyard: GPU sampling failed: %s", error)
            return {}
        total = sum(m.total for m in memory)
        sample = {"gpu_utilization_percent": sum(utilisation) / len(utilisation)}
        if total:
            sample["gpu_memory_used_fraction"] = sum(m.used for m in memory) / total
        return sample
