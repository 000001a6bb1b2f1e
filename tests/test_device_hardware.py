"""The hardware record the CUDA backend plans for, from what a device reports (CuPy's `Device.attributes`): the
memory bandwidth a split stage's partial sums are priced at scales with the device's memory clock and bus."""

from __future__ import annotations

import pytest
from convgen.cuda import device_hardware
from convgen.cuda_launch import H200

# The memory clock in kHz and the bus in bits: the H200 SXM's by its specification, the H100 SXM's as one reported
# them (benchmarks/measured/2026-12-05-h100-s36-24a0efa-gpu.txt).
H200_MEMORY = {"MemoryClockRate": 3_201_000, "GlobalMemoryBusWidth": 6144}
H100_MEMORY = {"MemoryClockRate": 2_619_000, "GlobalMemoryBusWidth": 5120}


def test_the_h200s_memory_gives_the_h200s_bandwidth_exactly():
    assert device_hardware(H200_MEMORY, "90").memory_bandwidth == H200.memory_bandwidth


def test_an_h100_streams_the_same_share_of_its_slower_memory():
    # 4.07 TB/s streamed of 4.917 TB/s at the H200's peak; the H100's peak is 2 * 2.619e9 * 640 B = 3.352 TB/s.
    assert device_hardware(H100_MEMORY, "90").memory_bandwidth == pytest.approx(2.7750e12, rel=1e-4)


@pytest.mark.parametrize("attributes", [{}, {"MemoryClockRate": 0, "GlobalMemoryBusWidth": 5120},
                                        {"MemoryClockRate": 2_619_000}])
def test_a_device_that_reports_no_memory_clock_or_bus_is_planned_as_an_h200(attributes):
    assert device_hardware(attributes, "90").memory_bandwidth == H200.memory_bandwidth
