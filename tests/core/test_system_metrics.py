"""System metrics of a stage (ance_core/system_metrics.py): sampled while the block runs, once more at its end, read
back oldest first; a line cut short by a kill is skipped."""

import time

from ance_core.system_metrics import SYSTEM_METRICS, SystemSampler, read_system_metrics


def test_samples_while_the_block_runs_and_once_at_its_end(tmp_path):
    with SystemSampler(tmp_path, every=0.05):
        deadline = time.monotonic() + 120  # (a busy machine samples late: wait for two, however long they take)
        while len(read_system_metrics(tmp_path)) < 2 and time.monotonic() < deadline:
            sum(range(10_000))  # a CPU-bound stage
    samples = read_system_metrics(tmp_path)
    assert len(samples) >= 3  # two while it ran, and the last one
    times = [s["timestamp"] for s in samples]
    assert times == sorted(times) and times[-1] <= time.time() * 1000
    last = samples[-1]
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
                "system/system_memory_usage_percentage", "system/process_memory_rss_megabytes",
                "system/disk_usage_percentage", "system/disk_available_megabytes"):
        assert key in last, key
    assert 0 <= last["system/cpu_utilization_percentage"] <= 100
    assert 0 < last["system/process_memory_rss_megabytes"] < last["system/system_memory_usage_megabytes"] * 4


def test_a_resumed_stage_appends_and_a_cut_line_is_skipped(tmp_path):
    with SystemSampler(tmp_path, every=60):  # no sample in the block: only the last one
        pass
    with open(tmp_path / SYSTEM_METRICS, "a") as f:
        f.write('{"timestamp": 1, "system/cpu_utilizat')  # killed mid-line
    with SystemSampler(tmp_path, every=60):
        pass
    samples = read_system_metrics(tmp_path)
    assert len(samples) == 2 and all("system/cpu_utilization_percentage" in s for s in samples)
    assert read_system_metrics(tmp_path / "none") == []


def test_a_stage_folder_gone_at_the_end_drops_the_sample_not_the_stage(tmp_path):
    folder = tmp_path / "stage"
    folder.mkdir()
    with SystemSampler(folder, every=60):
        folder.rename(tmp_path / "published")  # the stage published (renamed) its folder before the block ended
    assert not (tmp_path / "published" / SYSTEM_METRICS).exists()  # the last sample had nowhere to go: dropped


def test_a_gpu_reading_nvml_cannot_give_drops_that_reading_not_the_sample(tmp_path, monkeypatch):
    """Under MIG NVML has no utilisation: the sample (CPU figures included) was dropped at every tick."""
    import sys
    import types

    class Memory:
        used, total = 3_000_000_000, 12_000_000_000

    def unsupported(handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nvml = types.SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
                                 nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetMemoryInfo=lambda h: Memory(),
                                 nvmlDeviceGetUtilizationRates=unsupported, nvmlDeviceGetPowerUsage=unsupported)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with SystemSampler(tmp_path, every=60):
        pass
    [sample] = read_system_metrics(tmp_path)
    assert "system/cpu_utilization_percentage" in sample and "system/gpu_0_utilization_percentage" not in sample
    assert sample["system/gpu_0_memory_usage_megabytes"] == 3000.0  # MLflow's megabytes: 1e6 bytes
    assert sample["system/gpu_0_memory_usage_percentage"] == 25.0


def test_a_sampling_interval_that_is_no_number_is_the_default_with_a_warning(monkeypatch):
    import pytest

    from ance_core.system_metrics import interval

    monkeypatch.setenv("ANCE_SYSTEM_METRICS_INTERVAL", "10s")
    with pytest.warns(UserWarning, match="'10s' is not a number of seconds"):
        assert interval() == 10.0  # (it raised ValueError when training or encoding started)
    monkeypatch.setenv("ANCE_SYSTEM_METRICS_INTERVAL", "0")
    assert interval() == 1.0  # (0 sampled in a tight loop)
    monkeypatch.setenv("ANCE_SYSTEM_METRICS_INTERVAL", "2.5")
    assert interval() == 2.5
