"""Machine facts are an input (issue 26 item 1): every test that reads CPU flags, the vendor, torch's
CPU capability, MKL's line or the core count takes them from a recorded machine (fixture
``recorded_machine``: an AMX Intel Xeon and an AVX2-only AMD EPYC, tests/machines/), never from the
CPU that runs it. The code reads them in one place (tasks/hpsv3/cpu.py, IMAGEBENCH_CPU_FACTS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.hpsv3.cpu import (
    CPU_FACTS_ENV,
    PINNED_CPU_ENV,
    CpuFactsError,
    cpu_facts,
    facts_differences,
    load_recorded_machine,
    parse_cpuinfo,
    usable_cores,
)

MACHINES = Path(__file__).resolve().parents[2] / "machines"
INTEL, AMD = MACHINES / "intel-xeon-amx.json", MACHINES / "amd-epyc-7763-avx2.json"
# What each recorded machine is, written out by hand from its files.
EXPECTED = {
    "intel-xeon-amx.json": {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Processor", "amx": True,
                            "avx512": True, "torch": "AVX512", "mkl_unpinned": "AMX", "cores": 2},
    "amd-epyc-7763-avx2.json": {"vendor": "AuthenticAMD", "model": "AMD EPYC 7763 64-Core Processor", "amx": False,
                                "avx512": False, "torch": "AVX2", "mkl_unpinned": "Intel(R) Architecture processors", "cores": 4},
}  # fmt: skip


def test_cpu_facts_are_the_recorded_machines(recorded_machine, monkeypatch) -> None:
    want = EXPECTED[recorded_machine.source.name]
    for pin in PINNED_CPU_ENV:
        monkeypatch.delenv(pin, raising=False)
    facts = cpu_facts()
    assert (facts["cpu_vendor"], facts["cpu_model"]) == (want["vendor"], want["model"])
    flags = facts["cpu_flags"]
    assert "avx2" in flags and "fma" in flags  # type: ignore[operator]
    assert any(f.startswith("amx") for f in flags) is want["amx"]  # type: ignore[union-attr]
    assert ("avx512f" in flags) is want["avx512"]  # type: ignore[operator]
    assert facts["torch_cpu_capability"] == want["torch"] and want["mkl_unpinned"] in facts["mkl"]  # type: ignore[operator]
    assert facts["recorded_facts"] == recorded_machine.source.name
    # Under the pins: torch takes ATEN_CPU_CAPABILITY as given, MKL writes its AVX2 line on Intel.
    pinned = cpu_facts({CPU_FACTS_ENV: str(recorded_machine.source), **PINNED_CPU_ENV})
    assert pinned["pins"] == PINNED_CPU_ENV and pinned["torch_cpu_capability"] == "AVX2"
    assert "AMX" not in pinned["mkl"] and "AVX-512" not in pinned["mkl"]  # type: ignore[operator]
    assert usable_cores() == want["cores"]


def test_cpu_facts_name_what_differs(recorded_machine) -> None:
    """A reference made on a machine with one kernel flag more and another MKL pin: both named."""
    here = cpu_facts()
    extra = "amx_fp16"  # Granite Rapids: on neither recorded machine
    assert extra not in here["cpu_flags"]  # type: ignore[operator]
    other = {**here, "cpu_flags": [*here["cpu_flags"], extra], "pins": {**here["pins"], "MKL_ENABLE_INSTRUCTIONS": "AVX512"}}  # type: ignore[dict-item]
    lines = facts_differences(other, here)
    assert lines[0] == f"cpu_flags: only at the reference ['{extra}'], only here []"
    assert lines[1].startswith("pins:") and "MKL_ENABLE_INSTRUCTIONS" in lines[1] and len(lines) == 2
    assert facts_differences(here, dict(here)) == []


def test_an_intel_amx_reference_checked_on_an_amd_avx2_machine_names_every_kernel_fact() -> None:
    intel = cpu_facts({CPU_FACTS_ENV: str(INTEL), **PINNED_CPU_ENV})
    amd = cpu_facts({CPU_FACTS_ENV: str(AMD), **PINNED_CPU_ENV})
    lines = {line.split(":")[0]: line for line in facts_differences(intel, amd)}
    assert set(lines) == {"cpu_flags", "cpu_model", "cpu_vendor", "mkl", "recorded_facts"}
    only_intel = json.loads(lines["cpu_flags"].split("only at the reference ")[1].split(", only here")[0].replace("'", '"'))
    assert {"amx_bf16", "amx_int8", "amx_tile", "avx512f", "avx512_bf16"} <= set(only_intel)
    assert lines["cpu_flags"].endswith("only here []")  # the AMD has no kernel flag the Intel lacks
    assert lines["cpu_vendor"] == "cpu_vendor: reference 'GenuineIntel', here 'AuthenticAMD'"
    # Unpinned, torch's own pick differs too.
    assert facts_differences(cpu_facts({CPU_FACTS_ENV: str(INTEL)}), cpu_facts({CPU_FACTS_ENV: str(AMD)}))[-1] == (
        "torch_cpu_capability: reference 'AVX512', here 'AVX2'")


def test_threads_and_workers_follow_the_machine_facts(recorded_machine) -> None:
    """The defaults sized from the cores (torch's intra-op threads, the CUDA preprocessing pool) read
    the cores through the seam."""
    import torch

    from tasks.hpsv3.pool import default_preprocess_workers
    from tasks.hpsv3.scorer import pin_intra_op_threads

    cores = recorded_machine.usable_cores
    before = torch.get_num_threads()
    try:
        assert pin_intra_op_threads(0) == cores == torch.get_num_threads()
        assert pin_intra_op_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert default_preprocess_workers("cuda") == max(1, cores - 1) and default_preprocess_workers("cpu") == 0


def test_cpuinfo_parser_reads_the_first_processor() -> None:
    text = (MACHINES / "intel-xeon-amx.cpuinfo").read_text(encoding="utf-8")
    two = text + "\nprocessor\t: 1\nvendor_id\t: Other\nmodel name\t: Other\nflags\t\t: sse\n"
    assert parse_cpuinfo(two) == parse_cpuinfo(text)
    assert parse_cpuinfo("") == ("unknown", "unknown", [])


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "not a readable machine facts file (JSONDecodeError"),
        ('{"cpuinfo": "missing.cpuinfo", "usable_cores": 2, "torch_cpu_capability": "AVX2", "mkl": {}}', "FileNotFoundError"),
        ('{"cpuinfo": "x.cpuinfo", "usable_cores": 0, "torch_cpu_capability": "AVX2", "mkl": {}}', "usable_cores must be a whole number >= 1, got 0"),
        ('{"cpuinfo": "x.cpuinfo", "usable_cores": 2, "torch_cpu_capability": "AVX2"}', "KeyError: 'mkl'"),
        ('{"cpuinfo": "x.cpuinfo", "usable_cores": 2, "torch_cpu_capability": "AVX2", "mkl": {"": 3}}', "mkl must map"),
    ],
)
def test_a_bad_facts_file_is_one_line_naming_it(tmp_path: Path, content: str, says: str) -> None:
    (tmp_path / "x.cpuinfo").write_text("vendor_id\t: X\n", encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    with pytest.raises(CpuFactsError) as info:
        load_recorded_machine(bad)
    message = str(info.value)
    assert message.startswith(f"{CPU_FACTS_ENV}={bad}: ") and says in message and "\n" not in message
    with pytest.raises(CpuFactsError):
        usable_cores({CPU_FACTS_ENV: str(bad)})


def test_children_that_make_numbers_record_the_machine_they_run_on(monkeypatch) -> None:
    """The parity children (and so the numeric pass on AVX2 kernels, `make test-numeric-avx2`) never
    inherit a recorded machine: their facts describe the kernels that made their numbers."""
    from .official_runtime import pinned_env

    monkeypatch.setenv(CPU_FACTS_ENV, str(INTEL))
    env = pinned_env()
    assert CPU_FACTS_ENV not in env and {k: env[k] for k in PINNED_CPU_ENV} == PINNED_CPU_ENV
