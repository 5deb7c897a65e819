"""What a measurement ran on: CPU model, cores, vector-instruction flags, torch build, GPU.

Every report that prints a speed or a training time records this (bench, study, training_info.json),
so a figure is never read without the hardware that produced it. It sits at the bottom of the data
flow: it imports nothing from model/.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def hardware_info(device: torch.device) -> dict:
    """CPU model, core and thread counts, torch version, CPU flags, and the GPU when `device` is one."""
    cpu = cpu_model()
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "cpu_flags": cpu_flags(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["summary"] = f"{info['gpu']} (CUDA)"
    else:
        info["summary"] = f"{cpu}, {info['cores']} cores, {info['torch_threads']} torch threads"
    return info


def cpu_summary() -> str:
    """One line for a CPU-only report: the CPU model and the torch version."""
    return f"{cpu_model()}, torch {torch.__version__}, CPU"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, or what platform knows where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The vector-instruction flags that decide which kernels are fast (AVX2, AVX-512 incl. bf16/VNNI, AMX)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma", "f16c")))
    return sorted(flags)
