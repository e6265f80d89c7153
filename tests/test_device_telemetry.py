"""Each replica's device telemetry (argosy/server/device_telemetry.py) against a fake NVML: an object with
NVML's functions answering recorded values (an H200's, as nvidia-smi showed them on the lent machine),
never the real library (nvmlInit fails here). The host's series come from psutil for real."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from argosy.server import device_telemetry
from argosy.server.device_telemetry import GPU_SERIES, HOST_SERIES, DeviceTelemetry, GpuTelemetry, HostTelemetry
from argosy.server.metrics import ServerMetrics

MIB = 1 << 20


class NVMLError(Exception):
    pass


def h200(index: int, **overrides) -> dict:
    values = dict(uuid=f"GPU-{index}a1b2c3-0000-4000-8000-00000000000{index}", name="NVIDIA H200",
                  bus=f"00000000:{index + 0x18:02X}:00.0", util=(87, 41), total=143771 * MIB, used=101234 * MIB,
                  temp=61, sm=1980, mem=3201, power_mw=512_345, limit_mw=700_000, energy_mj=9_876_543_210,
                  reasons=0, violations={0: 3_500_000, 1: 0, 2: 0, 3: 0, 4: 12_000_000, 5: 0}, unsupported=())
    return {**values, **overrides}


class FakeNvml:
    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, *gpus: dict, events: bool = True):
        self.gpus = list(gpus)
        self.xids: list[tuple[int, int]] = []  # (gpu index, XID) waiting to be read
        self.events = events
        self.calls: list[str] = []

    def _gpu(self, handle, fn: str) -> dict:
        self.calls.append(fn)
        gpu = self.gpus[handle]
        if fn in gpu["unsupported"]:
            raise NVMLError("Not Supported")
        return gpu

    def nvmlInit(self):
        self.calls.append("nvmlInit")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return self._gpu(h, "uuid")["uuid"]

    def nvmlDeviceGetName(self, h):
        return self._gpu(h, "name")["name"]

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._gpu(h, "pci")["bus"].encode())

    def nvmlDeviceGetUtilizationRates(self, h):
        gpu, mem = self._gpu(h, "util")["util"]
        return SimpleNamespace(gpu=gpu, memory=mem)

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self._gpu(h, "memory")
        return SimpleNamespace(total=g["total"], used=g["used"], free=g["total"] - g["used"])

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._gpu(h, "temp")["temp"]

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._gpu(h, "clock")["sm" if clock == self.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._gpu(h, "power")["power_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._gpu(h, "limit")["limit_mw"]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._gpu(h, "energy")["energy_mj"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._gpu(h, "reasons")["reasons"]

    def nvmlDeviceGetViolationStatus(self, h, policy):
        return SimpleNamespace(violationTime=self._gpu(h, "violations")["violations"][policy], referenceTime=0)

    def nvmlEventSetCreate(self):
        if not self.events:
            raise NVMLError("Not Supported")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, kinds, event_set):
        assert kinds == self.nvmlEventTypeXidCriticalError and event_set == "event-set"

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        assert timeout_ms == 0  # a scrape never waits for an event
        if not self.xids:
            raise NVMLError("Timeout")
        index, xid = self.xids.pop(0)
        return SimpleNamespace(device=index, eventType=self.nvmlEventTypeXidCriticalError, eventData=xid)


SAMPLE = re.compile(r'^([\w:]+)(?:\{(.*)\})? (\S+)$')


def parse(text: str) -> tuple[dict[tuple[str, frozenset], float], dict[str, str]]:
    """Exposition text -> ({(name, labels): value}, {name: TYPE})."""
    values, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            name, labels, value = SAMPLE.match(line).groups()
            pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels or ""))
            values[(name, pairs)] = float(value)
    return values, types


def value(values, name: str, **labels) -> float:
    found = [v for (n, ls), v in values.items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_gpu_series_carry_dcgm_exporters_names_units_and_labels():
    nvml = FakeNvml(h200(0), h200(1, reasons=0x4 | 0x40, util=(100, 90), temp=88))
    text = DeviceTelemetry(GpuTelemetry(nvml, None, hostname="node-a"), None).render()
    values, types = parse(text)
    labels = {"gpu": "1", "UUID": h200(1)["uuid"], "pci_bus_id": "00000000:19:00.0", "device": "nvidia1",
              "modelName": "NVIDIA H200", "Hostname": "node-a"}
    assert value(values, "DCGM_FI_DEV_GPU_UTIL", **labels) == 100
    assert {k for k, _ in next(ls for (n, ls) in values if n == "DCGM_FI_DEV_GPU_UTIL")} == set(labels)
    assert value(values, "DCGM_FI_DEV_FB_USED", gpu="0") == 101234  # MiB, as dcgm-exporter
    assert value(values, "DCGM_FI_DEV_FB_FREE", gpu="0") == 143771 - 101234
    assert value(values, "DCGM_FI_DEV_FB_TOTAL", gpu="0") == 143771
    assert value(values, "DCGM_FI_DEV_GPU_TEMP", gpu="1") == 88
    assert value(values, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 1980
    assert value(values, "DCGM_FI_DEV_MEM_CLOCK", gpu="0") == 3201
    assert value(values, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == pytest.approx(512.345)  # W from NVML's mW
    assert value(values, "DCGM_FI_DEV_POWER_MGMT_LIMIT", gpu="0") == 700
    assert value(values, "DCGM_FI_DEV_POWER_VIOLATION", gpu="0") == 3500  # us from NVML's ns
    assert value(values, "DCGM_FI_DEV_LOW_UTIL_VIOLATION", gpu="0") == 12000
    assert value(values, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu="1") == 0x44
    throttled = {dict(ls)["reason"] for (n, ls), v in values.items()
                 if n == "argosy_gpu_throttle" and dict(ls)["gpu"] == "1" and v == 1}
    assert throttled == {"sw_power_cap", "hw_thermal_slowdown"}  # the bits decoded
    assert value(values, "argosy_gpu_throttle", gpu="0", reason="sw_power_cap") == 0
    # dcgm-exporter's counters keep their names: no _total added
    assert types["DCGM_FI_DEV_POWER_VIOLATION"] == "counter" and "DCGM_FI_DEV_POWER_VIOLATION_total" not in text
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter" and types["DCGM_FI_DEV_GPU_UTIL"] == "gauge"


def test_only_the_gpus_the_replica_sees_are_reported():
    gpus = [h200(i) for i in range(4)]
    assert [g.index for g in GpuTelemetry(FakeNvml(*gpus), "2,0").gpus] == [2, 0]
    assert [g.index for g in GpuTelemetry(FakeNvml(*gpus), h200(3)["uuid"][:12]).gpus] == [3]  # a UUID prefix
    assert [g.index for g in GpuTelemetry(FakeNvml(*gpus), "1,7,2").gpus] == [1]  # CUDA stops at a bad entry
    assert [g.index for g in GpuTelemetry(FakeNvml(*gpus), "").gpus] == []


def test_xid_errors_are_counted_and_the_last_is_kept():
    nvml = FakeNvml(h200(0), h200(1))
    telemetry = DeviceTelemetry(GpuTelemetry(nvml, None), None)
    values, _ = parse(telemetry.render())
    assert value(values, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0
    nvml.xids += [(1, 48), (1, 79), (0, 13)]
    values, _ = parse(telemetry.render())
    assert value(values, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79  # the last one
    assert value(values, "argosy_gpu_xid_errors_total", gpu="1") == 2
    assert value(values, "argosy_gpu_xid_errors_total", gpu="0") == 1
    values, _ = parse(telemetry.render())  # nothing new: the count stays
    assert value(values, "argosy_gpu_xid_errors_total", gpu="1") == 2


def test_a_reading_the_gpu_does_not_support_is_left_out_not_zero():
    nvml = FakeNvml(h200(0, unsupported=("power", "reasons", "violations")), events=False)
    values, _ = parse(DeviceTelemetry(GpuTelemetry(nvml, None), None).render())
    names = {n for n, _ in values}
    assert "DCGM_FI_DEV_POWER_USAGE" not in names and "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in names
    assert "argosy_gpu_throttle" not in names and "DCGM_FI_DEV_POWER_VIOLATION" not in names
    assert value(values, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 87  # the rest is there
    assert value(values, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0  # no events on this GPU: none seen


def test_without_a_driver_a_cuda_replica_reports_its_host_only(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    def no_library():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)  # what the real one does on a machine without a GPU
    telemetry = DeviceTelemetry.for_device("cuda")
    assert telemetry.gpus is None and telemetry.host is not None
    names = {n for n, _ in parse(telemetry.render())[0]}
    assert names == set(HOST_SERIES) and not any(n.startswith("DCGM") for n in names)
    assert DeviceTelemetry.for_device("cpu").gpus is None  # a CPU replica never loads NVML


def test_host_series_are_plausible():
    host = HostTelemetry()
    sum(range(2_000_000))  # some CPU time for the process to have used
    values = {name: v for name, _, v in host.samples()}
    assert set(values) == set(HOST_SERIES)
    assert 0 <= values["argosy_host_cpu_usage_perc"] <= 1 and 0 <= values["argosy_host_replica_cpu_usage_perc"] <= 1
    assert 0 < values["argosy_host_memory_used_bytes"] <= values["argosy_host_memory_total_bytes"]
    assert 0 < values["argosy_host_replica_resident_bytes"] < values["argosy_host_memory_total_bytes"]


def test_the_replicas_metrics_add_the_telemetry_and_every_series_is_documented():
    telemetry = DeviceTelemetry(GpuTelemetry(FakeNvml(h200(0)), None, hostname="n"), HostTelemetry())
    body = ServerMetrics("tiny", lambda: {}, telemetry).render().decode()
    assert "vllm:num_requests_running" in body and 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in body
    assert "argosy_host_cpu_usage_perc " in body
    from tests.test_observe_fleet import documented  # imports the openai client: not on every GPU machine

    docs = documented()
    _, types = parse(body)
    for name, series in {**GPU_SERIES, **HOST_SERIES}.items():
        assert name in docs, f"{name} is not in docs/metrics.md"
        assert docs[name][0] == series.kind == types[name], name
    assert docs["DCGM_FI_DEV_SM_CLOCK"][1] == set(device_telemetry.DCGM_LABELS)
    assert docs["argosy_gpu_throttle"][1] == {"gpu", "UUID", "reason"}


def test_the_gateway_reads_each_replicas_busiest_gpu_fullest_memory_and_throttling():
    from argosy.gateway.scraper import parse_gauges

    def scrape(*gpus: dict) -> dict[str, float]:
        telemetry = DeviceTelemetry(GpuTelemetry(FakeNvml(*gpus), None), HostTelemetry())
        return parse_gauges(ServerMetrics("tiny", lambda: {"num_waiting": 2}, telemetry).render())

    g = scrape(h200(0), h200(1, util=(100, 90), used=140_000 * MIB, reasons=0x4))
    assert g["waiting"] == 2 and g["device_busy"] == 1.0 and g["throttled"] == 1.0
    assert g["device_memory"] == pytest.approx(140_000 / 143_771)
    assert scrape(h200(0, reasons=0x1))["throttled"] == 0.0  # an idle GPU's clocks are down for no harm
    host = parse_gauges(ServerMetrics("tiny", lambda: {}, DeviceTelemetry(None, HostTelemetry())).render())
    assert 0 <= host["device_busy"] <= 1 and 0 < host["device_memory"] < 1 and "throttled" not in host
