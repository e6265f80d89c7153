"""Each replica's device telemetry, read when /metrics is scraped (docs/metrics.md, "Device telemetry").

GPUs through NVML (`nvidia-ml-py`), under the names, units and labels of NVIDIA's dcgm-exporter
(`DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",...}`), so Grafana dashboards and alerts written for it read
a replica unchanged: utilization, memory used/free/total, temperature, SM and memory clocks, power and its
limit, energy, the clock-throttle reasons (the bitmask) and the time spent throttled per cause (the
`*_VIOLATION` counters dcgm-exporter ships commented out), and the last XID error. Beside them, throttling
decoded as its own series (`argosy_gpu_throttle{reason=...}`: 1 while that reason holds clocks down) and
XID errors counted (`argosy_gpu_xid_errors_total`). The GPUs are those the replica sees
(CUDA_VISIBLE_DEVICES, by index or UUID; all of them when unset), labelled with NVML's index as
dcgm-exporter does.

The host through psutil, on every replica (CPU replicas are watched on these): CPU and memory use of
the machine and of this replica's process (`argosy_host_*`).

The exposition is written here rather than through prometheus_client, which would add `_total` to
dcgm-exporter's counters. Any reading NVML does not support on a GPU is left out, not reported as 0.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

MIB = 1 << 20
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
# NVML's clocks-event (throttle) reason bits, by the name argosy_gpu_throttle's `reason` label gives them.
THROTTLE_REASONS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}
# NVML perf policies (nvmlDeviceGetViolationStatus) -> dcgm-exporter's counter of microseconds throttled.
VIOLATIONS = {0: "DCGM_FI_DEV_POWER_VIOLATION", 1: "DCGM_FI_DEV_THERMAL_VIOLATION",
              2: "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", 3: "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
              4: "DCGM_FI_DEV_LOW_UTIL_VIOLATION", 5: "DCGM_FI_DEV_RELIABILITY_VIOLATION"}


@dataclass(frozen=True)
class Series:
    name: str
    kind: str  # gauge or counter
    help: str


GPU_SERIES = {s.name: s for s in (
    Series("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    Series("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    Series("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    Series("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    Series("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB)."),
    Series("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    Series("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    Series("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    Series("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Series("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Enforced power limit (in W)."),
    Series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    Series("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask of NVML's)."),
    Series("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in us)."),
    Series("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."),
    Series("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter",
           "Throttling duration due to sync-boost constraints (in us)."),
    Series("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter",
           "Throttling duration due to board limit constraints (in us)."),
    Series("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter", "Throttling duration due to low utilization (in us)."),
    Series("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter",
           "Throttling duration due to reliability constraints (in us)."),
    Series("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    Series("argosy_gpu_throttle", "gauge",
           "1 while this reason holds the GPU's clocks down (NVML's clocks-event reasons)."),
    Series("argosy_gpu_xid_errors_total", "counter", "XID errors NVML reported since the replica started."),
)}
HOST_SERIES = {s.name: s for s in (
    Series("argosy_host_cpu_usage_perc", "gauge",
           "Share of all the host's CPU time in use since the last scrape (0..1)."),
    Series("argosy_host_memory_used_bytes", "gauge", "Host memory in use (total minus available)."),
    Series("argosy_host_memory_total_bytes", "gauge", "Host memory."),
    Series("argosy_host_replica_cpu_usage_perc", "gauge",
           "Share of all the host's CPU time this replica's process used since the last scrape (0..1)."),
    Series("argosy_host_replica_resident_bytes", "gauge", "Resident memory of this replica's process."),
)}

Sample = tuple[str, dict[str, str], float]


@dataclass
class Gpu:
    index: int
    handle: Any
    labels: dict[str, str]
    xid_last: int = 0
    xid_count: int = 0


def visible_gpu_indices(nvml: Any, count: int, visible: str | None) -> list[int]:
    """NVML indices of the GPUs CUDA_VISIBLE_DEVICES names (indices or GPU-UUIDs); all when unset."""
    if visible is None:
        return list(range(count))
    uuids = {_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))): i for i in range(count)}
    out = []
    for item in (v.strip() for v in visible.split(",")):
        if item.isdigit() and int(item) < count:
            out.append(int(item))
        elif item.startswith("GPU-"):
            out += [i for uuid, i in uuids.items() if uuid.startswith(item)][:1]
        else:  # CUDA stops at the first entry it cannot use
            break
    return out


class GpuTelemetry:
    """NVML readings of the visible GPUs. `nvml` is the pynvml module, or an object with its functions."""

    def __init__(self, nvml: Any, visible: str | None = None, hostname: str | None = None):
        self.nvml = nvml
        nvml.nvmlInit()
        host = hostname or socket.gethostname()
        self.gpus = []
        for i in visible_gpu_indices(nvml, nvml.nvmlDeviceGetCount(), visible):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            labels = {"gpu": str(i), "UUID": _text(nvml.nvmlDeviceGetUUID(h)),
                      "pci_bus_id": _text(self._read(nvml.nvmlDeviceGetPciInfo, h, default=None, attr="busId") or ""),
                      "device": f"nvidia{i}", "modelName": _text(nvml.nvmlDeviceGetName(h)), "Hostname": host}
            self.gpus.append(Gpu(i, h, labels))
        self.by_uuid = {g.labels["UUID"]: g for g in self.gpus}
        self.events = None
        try:  # XID errors arrive as NVML events; some GPUs and drivers do not offer them
            self.events = nvml.nvmlEventSetCreate()
            for g in self.gpus:
                nvml.nvmlDeviceRegisterEvents(g.handle, nvml.nvmlEventTypeXidCriticalError, self.events)
        except nvml.NVMLError as exc:
            logger.info("NVML XID events unavailable (%s): DCGM_FI_DEV_XID_ERRORS stays at 0", exc)

    def _read(self, fn, *args, default=None, attr: str | None = None):
        try:
            value = fn(*args)
        except self.nvml.NVMLError:  # not supported on this GPU, or a transient failure: leave it out
            return default
        return getattr(value, attr) if attr else value

    def drain_xid_events(self) -> None:
        if self.events is None:
            return
        while True:
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing (more) pending
                return
            gpu = self.by_uuid.get(_text(self._read(self.nvml.nvmlDeviceGetUUID, data.device, default="")))
            if gpu is not None and data.eventType & self.nvml.nvmlEventTypeXidCriticalError:
                gpu.xid_last, gpu.xid_count = int(data.eventData), gpu.xid_count + 1

    def samples(self) -> Iterator[Sample]:
        nvml, read = self.nvml, self._read
        self.drain_xid_events()
        for g in self.gpus:
            h, labels = g.handle, g.labels
            values: dict[str, float | None] = {}
            util = read(nvml.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                values["DCGM_FI_DEV_GPU_UTIL"], values["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.gpu, util.memory
            mem = read(nvml.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                values["DCGM_FI_DEV_FB_USED"] = mem.used // MIB
                values["DCGM_FI_DEV_FB_FREE"] = mem.free // MIB
                values["DCGM_FI_DEV_FB_TOTAL"] = mem.total // MIB
            values["DCGM_FI_DEV_GPU_TEMP"] = read(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            values["DCGM_FI_DEV_SM_CLOCK"] = read(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
            values["DCGM_FI_DEV_MEM_CLOCK"] = read(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
            values["DCGM_FI_DEV_POWER_USAGE"] = _scaled(read(nvml.nvmlDeviceGetPowerUsage, h), 1e-3)  # mW -> W
            values["DCGM_FI_DEV_POWER_MGMT_LIMIT"] = _scaled(read(nvml.nvmlDeviceGetEnforcedPowerLimit, h), 1e-3)
            values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = read(nvml.nvmlDeviceGetTotalEnergyConsumption, h)
            reasons = self.throttle_reasons(h)
            values["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = reasons
            for policy, name in VIOLATIONS.items():  # ns -> us
                values[name] = _scaled(read(nvml.nvmlDeviceGetViolationStatus, h, policy, attr="violationTime"), 1e-3)
            values["DCGM_FI_DEV_XID_ERRORS"] = g.xid_last
            for name, value in values.items():
                if value is not None:
                    yield name, labels, value
            short = {"gpu": labels["gpu"], "UUID": labels["UUID"]}
            if reasons is not None:
                for reason, bit in THROTTLE_REASONS.items():
                    yield "argosy_gpu_throttle", {**short, "reason": reason}, 1 if int(reasons) & bit else 0
            yield "argosy_gpu_xid_errors_total", short, g.xid_count

    def throttle_reasons(self, handle) -> int | None:
        nvml = self.nvml
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # the older name (drivers before 535)
        return self._read(fn, handle)


class HostTelemetry:
    """CPU and memory of the host and of this process (psutil)."""

    def __init__(self):
        import psutil

        self.psutil = psutil
        self.process = psutil.Process()
        self.cpus = psutil.cpu_count() or 1
        psutil.cpu_percent(None)  # the first reading starts the interval the next one covers
        self.process.cpu_percent(None)

    def samples(self) -> Iterator[Sample]:
        mem = self.psutil.virtual_memory()
        yield "argosy_host_cpu_usage_perc", {}, self.psutil.cpu_percent(None) / 100
        yield "argosy_host_memory_used_bytes", {}, mem.total - mem.available
        yield "argosy_host_memory_total_bytes", {}, mem.total
        yield "argosy_host_replica_cpu_usage_perc", {}, self.process.cpu_percent(None) / 100 / self.cpus
        yield "argosy_host_replica_resident_bytes", {}, self.process.memory_info().rss


class DeviceTelemetry:
    """What a replica's /metrics adds: the host always, the GPUs when the engine runs on CUDA."""

    def __init__(self, gpus: GpuTelemetry | None, host: HostTelemetry | None):
        self.gpus, self.host = gpus, host
        self.lock = threading.Lock()  # scrapes may overlap; NVML handles and psutil's intervals are shared

    @classmethod
    def for_device(cls, device_type: str) -> DeviceTelemetry:
        gpus = None
        if device_type == "cuda":
            try:
                import pynvml

                gpus = GpuTelemetry(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
            except Exception as exc:  # no driver, no library: the replica still serves, without GPU series
                logger.warning("GPU telemetry unavailable (NVML: %s); /metrics has no DCGM_FI_* series", exc)
        try:
            host = HostTelemetry()
        except Exception as exc:  # psutil missing or refused by the platform
            logger.warning("host telemetry unavailable (%s)", exc)
            host = None
        return cls(gpus, host)

    def render(self) -> str:
        """The Prometheus text exposition of every series (HELP and TYPE once each)."""
        with self.lock:
            samples = [*(self.gpus.samples() if self.gpus else ()), *(self.host.samples() if self.host else ())]
        by_name: dict[str, list[Sample]] = {}
        for sample in samples:
            by_name.setdefault(sample[0], []).append(sample)
        lines = []
        for name, group in by_name.items():
            series = GPU_SERIES.get(name) or HOST_SERIES[name]
            lines += [f"# HELP {name} {series.help}", f"# TYPE {name} {series.kind}"]
            lines += [f"{name}{_labels(labels)} {_number(value)}" for _, labels, value in group]
        return "\n".join(lines) + "\n" if lines else ""


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
