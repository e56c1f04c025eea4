"""The CPU facts that decide bfloat16 bits on a CPU, and the pins that make two runs comparable.

On CPU, three libraries pick their kernels from the processor by themselves: ATen (its own
vectorised ops; ``ATEN_CPU_CAPABILITY``), oneDNN (``ONEDNN_MAX_CPU_ISA``) and MKL (the GEMMs,
bfloat16 ones included; ``MKL_ENABLE_INSTRUCTIONS``). The first two pins do not reach MKL: a
machine with AMX or AVX-512 then moves official bf16 mu by up to 7.3e-3 against an AVX2 one
(docs/HPSV3.md). Standard library only (torch is asked when it is importable), so the official
runtime's interpreter can use this file too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# Every parity and numerics path runs these kernels: AVX2 is on every x86-64 CPU of the last decade.
PINNED_CPU_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
PINNED_CPU_CAPABILITY = "AVX2"
# The flags that change which kernels the three libraries may pick.
_KERNEL_FLAGS = re.compile(r"^(avx\S*|amx\S*|fma|f16c|sse4_2)$")


def cpu_model_and_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """The processor's name and its kernel-relevant flags (sorted), from /proc/cpuinfo."""
    model, flags = "unknown", []
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = sorted(f for f in value.split() if _KERNEL_FLAGS.match(f))
    return model, flags


def mkl_header(env: dict[str, str] | None = None, python: str = sys.executable) -> str:
    """MKL's own line about itself (version and, on Intel CPUs, the instruction set it dispatches
    to), from MKL_VERBOSE in a child process; "" where torch has no MKL."""
    code = "import torch; a = torch.ones(32, 32); a @ a"
    child_env = {**(os.environ if env is None else env), "MKL_VERBOSE": "1"}
    try:
        done = subprocess.run([python, "-c", code], env=child_env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in done.stdout.splitlines():
        if line.startswith("MKL_VERBOSE") and "GEMM" not in line:
            return line.removeprefix("MKL_VERBOSE").strip()
    return ""


def cpu_facts(env: dict[str, str] | None = None) -> dict[str, object]:
    """What a bf16 number made on this machine depends on: recorded beside every CPU reference so
    that a mismatch names the machine fact that differs."""
    env = dict(os.environ if env is None else env)
    model, flags = cpu_model_and_flags()
    facts: dict[str, object] = {
        "cpu_model": model,
        "cpu_flags": flags,
        "pins": {k: env.get(k) for k in PINNED_CPU_ENV},
        "mkl": mkl_header(env),
    }
    try:
        import torch

        facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        pass
    return facts


def facts_differences(recorded: dict[str, object], here: dict[str, object]) -> list[str]:
    """One line per machine fact that differs between a recorded reference and this machine."""
    lines = []
    for key in sorted(set(recorded) | set(here)):
        a, b = recorded.get(key), here.get(key)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            lines.append(f"{key}: only at the reference {only_a}, only here {only_b}")
        else:
            lines.append(f"{key}: reference {a!r}, here {b!r}")
    return lines
