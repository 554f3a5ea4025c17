"""System metrics of a long stage (training, corpus encoding): CPU, memory, disk and, where there is one, GPU use,
sampled by a background thread into <stage folder>/system_metrics.jsonl while the stage runs.

The run's MLflow logging sends them to the stage's model run under the names MLflow's own system-metrics monitor
uses (`system/cpu_utilization_percentage`, `system/gpu_0_utilization_percentage`, ...), so they show in the run's
"System metrics" tab; each line carries its wall-clock time. psutil reads the host; NVML (the `nvidia-ml-py`
package, in the GPU image) reads each GPU's utilisation, memory and power, and without it torch's own view of this
process's GPU memory is recorded. A machine without psutil records nothing (a warning once): the stage runs the same.
Sampled every ANCE_SYSTEM_METRICS_INTERVAL seconds (10, MLflow's default), and once more when the stage ends.
"""

import contextlib
import json
import os
import threading
import time
import warnings
from pathlib import Path

SYSTEM_METRICS = "system_metrics.jsonl"
PREFIX = "system/"
_warned = False


def interval() -> float:
    """ANCE_SYSTEM_METRICS_INTERVAL seconds, at least 1 (0 would sample in a tight loop); 10 with a warning when it is
    not a number (a typo there never stops a stage)."""
    value = os.environ.get("ANCE_SYSTEM_METRICS_INTERVAL", "10")
    try:
        seconds = float(value)
    except ValueError:
        warnings.warn(f"ANCE_SYSTEM_METRICS_INTERVAL={value!r} is not a number of seconds: system metrics are sampled "
                      "every 10 s", stacklevel=2)
        return 10.0
    return max(seconds, 1.0) if seconds == seconds else 10.0  # (NaN: the default)


class _Gpus:
    """Each visible GPU's readings: NVML where it loads, else torch's memory counters for this process."""

    def __init__(self):
        self.nvml, self.handles = None, []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no package, no driver, no GPU
            self.nvml = None

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.nvml is not None:
            for i, handle in enumerate(self.handles):  # each reading on its own: a GPU that does not report one
                # (utilisation under MIG, power on some boards) keeps the others, and the sample its CPU figures
                with contextlib.suppress(Exception):
                    out[f"gpu_{i}_utilization_percentage"] = float(
                        self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                with contextlib.suppress(Exception):
                    memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                    out[f"gpu_{i}_memory_usage_megabytes"] = memory.used / 1e6
                    out[f"gpu_{i}_memory_usage_percentage"] = 100.0 * memory.used / memory.total
                with contextlib.suppress(Exception):
                    out[f"gpu_{i}_power_usage_watts"] = self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000
            return out
        import torch

        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                out[f"gpu_{i}_memory_usage_megabytes"] = torch.cuda.memory_reserved(i) / 1e6
        return out

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass


class SystemSampler:
    """`with SystemSampler(folder):` samples while the block runs, appending to folder/system_metrics.jsonl (a resumed
    stage adds to what its first attempt wrote). `every`: seconds between samples (default `interval()`)."""

    def __init__(self, folder: str | Path, every: float | None = None):
        self.path = Path(folder) / SYSTEM_METRICS
        self.every = interval() if every is None else every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "SystemSampler":
        global _warned
        try:
            import psutil
        except ImportError:
            if not _warned:
                _warned = True
                warnings.warn("psutil is not installed: no system metrics are recorded", stacklevel=2)
            return self
        self.psutil, self.process, self.gpus = psutil, psutil.Process(), _Gpus()
        psutil.cpu_percent(None)  # the first call starts the interval the next one measures
        try:  # a line an earlier attempt's kill cut short is ended, so that this attempt's lines stay whole
            with open(self.path, "rb+") as f:
                if f.seek(0, 2) > 0:
                    f.seek(-1, 2)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
        except OSError:  # no file yet
            pass
        self._thread = threading.Thread(target=self._loop, name="system-metrics", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._record()  # the stage's last reading
        self.gpus.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._record()

    def sample(self) -> dict[str, float]:
        psutil = self.psutil
        memory = psutil.virtual_memory()
        values = {"cpu_utilization_percentage": psutil.cpu_percent(None),  # (megabytes: 1e6 bytes, as MLflow's)
                  "system_memory_usage_megabytes": memory.used / 1e6,
                  "system_memory_usage_percentage": memory.percent,
                  "process_memory_rss_megabytes": self.process.memory_info().rss / 1e6}
        try:
            disk = psutil.disk_usage(str(self.path.parent))
            values |= {"disk_usage_percentage": disk.percent, "disk_available_megabytes": disk.free / 1e6}
        except OSError:  # the folder was published (renamed) or removed
            pass
        values |= self.gpus.read()
        return {"timestamp": int(time.time() * 1000)} | {PREFIX + k: round(v, 3) for k, v in values.items()}

    def _record(self) -> None:
        """One sample appended; a sample that cannot be taken or written is dropped, never the stage (the folder
        being published or removed at the end; a reading that fails)."""
        try:
            record = self.sample()
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except Exception:
            pass


def read_system_metrics(folder: str | Path) -> list[dict]:
    """A stage folder's samples, oldest first ([] when it has none: an older folder, or no psutil)."""
    path = Path(folder) / SYSTEM_METRICS
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
    return records
