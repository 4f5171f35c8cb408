"""Fingerprints: parsing `nvidia-smi topo -m`, the CPU fingerprint and naming differences."""

import pytest

from ficco.features.fingerprint import cpu_fingerprint, fingerprint_differences, parse_topology

H200X2 = """\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\t0-47\t0\t\tN/A
GPU1\tNV18\t X \t0-47\t0\t\tN/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""

MIXED_WITH_NIC = """\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\x1b[0m
GPU0\t X \tNV4\tSYS\tSYS\tPIX\t0-7\t0
GPU1\tNV4\t X \tSYS\tSYS\tSYS\t0-7\t0
GPU2\tSYS\tSYS\t X \tNV4\tSYS\t8-15\t1
GPU3\tSYS\tSYS\tNV4\t X \tSYS\t8-15\t1
NIC0\tPIX\tSYS\tSYS\tSYS\t X

Legend:
  X    = Self
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (H200X2, "NV18"),
        (MIXED_WITH_NIC, "NV4 x2, SYS x4"),
        ("No devices were found", "unknown"),
        ("", "unknown"),
    ],
)
def test_parse_topology_summarises_gpu_pair_links(text, expected):
    assert parse_topology(text) == expected


def test_cpu_fingerprint_has_no_hostname():
    import socket

    fp = cpu_fingerprint(world_size=2)
    assert fp["backend"] == "gloo" and fp["world_size"] == 2 and fp["torch"]
    assert socket.gethostname() not in {str(v) for v in fp.values()}


def test_fingerprint_differences_name_changed_added_and_removed_keys():
    diff = fingerprint_differences(
        {"gpu_name": "NVIDIA H200", "nccl": "2.28.9"}, {"gpu_name": "NVIDIA H100", "cuda": "13.0"}
    )
    assert diff == [
        "cuda: '<absent>' in the dataset vs '13.0' here",
        "gpu_name: 'NVIDIA H200' in the dataset vs 'NVIDIA H100' here",
        "nccl: '2.28.9' in the dataset vs '<absent>' here",
    ]
    assert fingerprint_differences({"a": 1}, {"a": 1}) == []
