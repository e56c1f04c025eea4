"""The CPU facts that decide bfloat16 bits on a CPU, and the pins that make two runs comparable.

On CPU, three libraries pick their kernels from the processor by themselves: ATen (its own
vectorised ops; ``ATEN_CPU_CAPABILITY``), oneDNN (``ONEDNN_MAX_CPU_ISA``) and MKL (the GEMMs,
bfloat16 ones included; ``MKL_ENABLE_INSTRUCTIONS``). The first two pins do not reach MKL: a
machine with AMX or AVX-512 then moves official bf16 mu by up to 7.3e-3 against an AVX2 one
(docs/HPSV3.md). Standard library only (torch is asked when it is importable), so the official
runtime's interpreter can use this file too.

Every machine fact the code acts on or records (processor, vendor, kernel flags, torch's CPU
capability, MKL's line, the cores this process may use) is read here and nowhere else. With
``IMAGEBENCH_CPU_FACTS=<file.json>`` they come from a recorded machine instead (tests/machines/):
the tests run as if on an AMX Intel or an AVX2-only AMD CPU, whatever CPU runs them. The kernels
themselves are never faked: a process that makes numbers records the machine it runs on
(tests/tasks/hpsv3/official_runtime.py drops the variable from its children).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Every parity and numerics path runs these kernels: AVX2 is on every x86-64 CPU of the last decade.
PINNED_CPU_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
PINNED_CPU_CAPABILITY = "AVX2"
# A recorded machine's facts in place of this one's (tests and CI; see the module docstring).
CPU_FACTS_ENV = "IMAGEBENCH_CPU_FACTS"
# The flags that change which kernels the three libraries may pick.
_KERNEL_FLAGS = re.compile(r"^(avx\S*|amx\S*|fma|f16c|sse4_2)$")
# The ATEN_CPU_CAPABILITY values torch obeys as given (aten/src/ATen/native/DispatchStub.cpp);
# any other value is ignored with a warning and torch picks by itself.
_ATEN_PINS = {"default": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512"}


class CpuFactsError(ValueError):
    """A recorded facts file that cannot be used: one line naming it and what is wrong."""


@dataclass(frozen=True)
class RecordedMachine:
    """Another machine's facts, as recorded in a facts file (tests/machines/README.md)."""

    source: Path
    cpuinfo: str  # its /proc/cpuinfo (the first processor is enough)
    usable_cores: int  # the cores a process could run on (os.sched_getaffinity)
    torch_cpu_capability: str  # what torch picks there with no ATEN_CPU_CAPABILITY
    mkl: dict[str, str]  # MKL's line by MKL_ENABLE_INSTRUCTIONS value ("" = unset)


def load_recorded_machine(path: Path) -> RecordedMachine:
    """Read a facts file; its ``cpuinfo`` is a file name beside it."""
    where = f"{CPU_FACTS_ENV}={path}"
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        cpuinfo = (Path(path).parent / raw["cpuinfo"]).read_text(encoding="utf-8")
        cores, capability, mkl = raw["usable_cores"], raw["torch_cpu_capability"], raw["mkl"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CpuFactsError(f"{where}: not a readable machine facts file ({type(exc).__name__}: {exc})") from None
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
        raise CpuFactsError(f"{where}: usable_cores must be a whole number >= 1, got {cores!r}")
    if not isinstance(mkl, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mkl.items()):
        raise CpuFactsError(f"{where}: mkl must map MKL_ENABLE_INSTRUCTIONS values to MKL's line")
    return RecordedMachine(Path(path), cpuinfo, cores, str(capability), mkl)


def recorded_machine(env: dict[str, str] | None = None) -> RecordedMachine | None:
    """The recorded machine named by IMAGEBENCH_CPU_FACTS, or None (this machine's facts)."""
    value = (os.environ if env is None else env).get(CPU_FACTS_ENV, "").strip()
    return load_recorded_machine(Path(value)) if value else None


def parse_cpuinfo(text: str) -> tuple[str, str, list[str]]:
    """The vendor, the processor's name and its kernel-relevant flags (sorted) of the first
    processor in /proc/cpuinfo text."""
    vendor, model, flags = "unknown", "unknown", []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and vendor == "unknown":
            vendor = value.strip()
        elif key == "model name" and model == "unknown":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = sorted(f for f in value.split() if _KERNEL_FLAGS.match(f))
    return vendor, model, flags


def _this_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def usable_cores(env: dict[str, str] | None = None) -> int:
    """The cores this process may run on (its affinity, not the machine's total), or the
    recorded machine's."""
    recorded = recorded_machine(env)
    return recorded.usable_cores if recorded else len(os.sched_getaffinity(0))


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


def _recorded_capability(recorded: RecordedMachine, env: dict[str, str]) -> str:
    """What torch reports on the recorded machine under ``env``: a known ATEN_CPU_CAPABILITY
    value is taken as given (torch does not check it against the CPU)."""
    return _ATEN_PINS.get(env.get("ATEN_CPU_CAPABILITY", ""), recorded.torch_cpu_capability)


def cpu_facts(env: dict[str, str] | None = None) -> dict[str, object]:
    """What a bf16 number made on this machine depends on: recorded beside every CPU reference so
    that a mismatch names the machine fact that differs. ``env``: the environment the numbers are
    made under (its pins, and IMAGEBENCH_CPU_FACTS for a recorded machine)."""
    env = dict(os.environ if env is None else env)
    recorded = recorded_machine(env)
    vendor, model, flags = parse_cpuinfo(recorded.cpuinfo if recorded else _this_cpuinfo())
    facts: dict[str, object] = {
        "cpu_vendor": vendor,
        "cpu_model": model,
        "cpu_flags": flags,
        "pins": {k: env.get(k) for k in PINNED_CPU_ENV},
    }
    if recorded:
        facts["mkl"] = recorded.mkl.get(env.get("MKL_ENABLE_INSTRUCTIONS", ""), "")
        facts["torch_cpu_capability"] = _recorded_capability(recorded, env)
        facts["recorded_facts"] = recorded.source.name  # never mistaken for the machine that ran
        return facts
    facts["mkl"] = mkl_header(env)
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
