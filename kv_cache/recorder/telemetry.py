"""Telemetry beside the measurements: the host (psutil) and each GPU (NVML), sampled once a second.

Host: CPU busy %, memory used, and the block-layer byte counters of the disk
that holds the cache directory (``/proc/diskstats`` via psutil) — what the
device really moved, to set beside what the benchmark says it moved: a
large gap means the page cache (or another process) was involved. GPUs: memory
used, utilisation, PCIe rx/tx throughput, temperature and power, where the
driver reports them (a missing reading is left out, never written as 0).

Samples go into the time series as gauges (``host_*``, ``disk_*``,
``gpu<i>_*``); ``summary()`` gives the window's totals and means.
"""

from __future__ import annotations

import os
import time

import psutil

from kv_cache.recorder.devlat import DeviceLatency


def disk_of(directory: str | None) -> str | None:
    """The psutil disk name (e.g. sda, nvme0n1, vda) of the device holding directory, or None."""
    if not directory:
        return None
    try:
        dev = os.stat(directory).st_dev
        name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
    except OSError:
        return None
    counters = psutil.disk_io_counters(perdisk=True) or {}
    return name if name in counters else None


class _Nvml:
    """NVML readings per GPU; absent (with the reason) when the library or the driver is missing."""

    def __init__(self):
        self.handles, self.names, self.why = [], [], ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.names = [str(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
        except ImportError:
            self.why = "nvidia-ml-py is not installed"
        except Exception as e:  # NVMLError: no driver, no device
            self.why = f"NVML unavailable ({e})"

    def read(self, i: int, h) -> dict[str, float]:
        nv, out = self.nv, {}
        probes = {
            f"gpu{i}_mem_used_bytes": lambda: nv.nvmlDeviceGetMemoryInfo(h).used,
            f"gpu{i}_util_pct": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            f"gpu{i}_pcie_rx_mbps": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) / 1e3,
            f"gpu{i}_pcie_tx_mbps": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) / 1e3,
            f"gpu{i}_temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            f"gpu{i}_power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1e3,
        }
        for name, probe in probes.items():
            try:
                out[name] = float(probe())
            except Exception:  # this reading is not supported on this device
                pass
        return out

    def close(self) -> None:
        if self.handles:
            self.nv.nvmlShutdown()


class Telemetry:
    """Call ``sample()`` as often as you like: it reads at most once a second."""

    def __init__(self, cache_dir: str | None, nvml: bool = True, device_latency: str = "off"):
        """device_latency: "on" traces the disk of cache_dir with eBPF (devlat.py); anything else is why not."""
        self.disk = disk_of(cache_dir)
        self.devlat = DeviceLatency(cache_dir) if device_latency == "on" else None
        self.devlat_off = "" if device_latency == "on" else device_latency
        self.nvml = _Nvml() if nvml else None
        psutil.cpu_percent(None)  # primes the CPU counter: the first reading then covers a real interval
        self._last_t = 0.0
        self._prev_disk = self._disk_counters()
        self._window_disk = None
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._peaks: dict[str, float] = {}

    def _disk_counters(self):
        if self.disk is None:
            return None
        return (psutil.disk_io_counters(perdisk=True) or {}).get(self.disk)

    def sample(self, measuring: bool) -> dict[str, float] | None:
        if self.devlat is not None:
            self.devlat.window(measuring)
        if measuring and self._window_disk is None:  # the window's first tick: the disk's starting counters
            self._window_disk = self._disk_counters()
        now = time.monotonic()
        if now - self._last_t < 1.0:
            return None
        dt = now - self._last_t if self._last_t else None
        self._last_t = now
        vm = psutil.virtual_memory()
        row = {"host_cpu_pct": psutil.cpu_percent(None), "host_mem_used_bytes": float(vm.total - vm.available)}
        d = self._disk_counters()
        if d is not None and self._prev_disk is not None and dt:
            row["disk_read_mbps"] = (d.read_bytes - self._prev_disk.read_bytes) / dt / 1e6
            row["disk_write_mbps"] = (d.write_bytes - self._prev_disk.write_bytes) / dt / 1e6
        self._prev_disk = d
        if self.nvml is not None:
            for i, h in enumerate(self.nvml.handles):
                row.update(self.nvml.read(i, h))
        if measuring:
            for k, v in row.items():
                self._sums[k] = self._sums.get(k, 0.0) + v
                self._counts[k] = self._counts.get(k, 0) + 1
                self._peaks[k] = max(self._peaks.get(k, v), v)
        return row

    def summary(self, benchmark_bytes: dict | None = None) -> dict:
        """Means and peaks over the window; the disk's block-layer bytes beside the benchmark's."""
        end = self._disk_counters()
        disk = None
        if self.disk is not None and end is not None and self._window_disk is not None:
            start = self._window_disk
            read, written = end.read_bytes - start.read_bytes, end.write_bytes - start.write_bytes
            disk = {"device": self.disk, "read_bytes": read, "write_bytes": written}
            if benchmark_bytes:
                disk["benchmark_read_bytes"] = benchmark_bytes.get("read", 0)
                disk["benchmark_write_bytes"] = benchmark_bytes.get("write", 0)
                disk["device_over_benchmark"] = {
                    d: (disk[f"{d}_bytes"] / benchmark_bytes[d] if benchmark_bytes.get(d) else None)
                    for d in ("read", "write")}
        gpus = []
        if self.nvml is not None:
            for i, name in enumerate(self.nvml.names):
                keys = [k for k in self._sums if k.startswith(f"gpu{i}_")]
                gpus.append({"index": i, "name": name,
                             **{f"{k[len(f'gpu{i}_'):]}_mean": self._sums[k] / self._counts[k] for k in keys},
                             **{f"{k[len(f'gpu{i}_'):]}_max": self._peaks[k] for k in keys}})
        mean = {k: self._sums[k] / self._counts[k] for k in self._sums if k.startswith("host_")}
        return {"samples": max(self._counts.values(), default=0), "disk": disk, "gpus": gpus,
                "nvml": "ok" if self.nvml is not None and not self.nvml.why else
                (self.nvml.why if self.nvml is not None else "off"),
                "host_cpu_pct_mean": mean.get("host_cpu_pct"),
                "host_mem_used_bytes_max": self._peaks.get("host_mem_used_bytes"),
                "device_latency": self.devlat.summary() if self.devlat is not None else
                {"unavailable": self.devlat_off}}

    def close(self) -> None:
        if self.devlat is not None:
            self.devlat.close()
        if self.nvml is not None:
            self.nvml.close()
