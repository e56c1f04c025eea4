"""The official HPSv3 code (hpsv3 1.0.0 under transformers 4.45.2), installed in a virtual
environment of its own under the build tree and run on the machine under test.

Why on this machine: in bfloat16 the CPU's math library (MKL picks AMX, AVX-512 or AVX2 kernels by
itself) moves official mu by up to 7.3e-3 between machines, as much as the regressions the parity
test exists to catch. A bf16 reference made elsewhere checks the other machine, not the code
(docs/HPSV3.md, "Parity with the official code").

The environment is built once and reused (``build/hpsv3-official/``, ignored by git; about a
minute from the package index). Nothing of it is imported here: the official code runs in its
own interpreter, driven by ``bench/hpsv3_official_reference.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BUILD_DIR = REPO / "build" / "hpsv3-official"
# The official package's runtime, pinned (transformers 4.45.2 is what hpsv3 1.0.0 pins; the rest is
# what that resolved to on 2026-11-26). torch is the project's own CPU build.
OFFICIAL_REQUIREMENTS = (
    "torch==2.13.0",
    "transformers==4.45.2",
    "tokenizers==0.20.3",
    "huggingface_hub==0.36.2",
    "safetensors==0.8.0",
    "pillow==13.0.0",
    "numpy==2.4.6",
    "requests==2.34.2",
    "PyYAML==6.0.4",
    "regex==2026.11.19",
    "tqdm==4.70.1",
    "packaging==26.4",
)
OFFICIAL_PACKAGE = "hpsv3==1.0.0"
INSTALL_TIMEOUT_S = 900


class OfficialRuntimeUnavailable(RuntimeError):
    """The official runtime could not be built (no package index, a failed install)."""


@dataclass(frozen=True)
class OfficialRuntime:
    python: Path  # the interpreter of the official environment
    src: Path  # the unpacked hpsv3 wheel (its hpsv3/ package)


def _spec_key() -> str:
    spec = "\n".join((*OFFICIAL_REQUIREMENTS, OFFICIAL_PACKAGE, f"python{sys.version_info[:2]}"))
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def _run_pip(args: list[str], what: str) -> None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise OfficialRuntimeUnavailable(f"{what}: pip did not finish in {INSTALL_TIMEOUT_S} s (package index unreachable?)") from exc
    if done.returncode != 0:
        errors = [ln for ln in (done.stderr + done.stdout).splitlines() if "WARNING: Location" not in ln]
        raise OfficialRuntimeUnavailable(
            f"{what} failed (exit {done.returncode}); the package index must be reachable to build the "
            f"official HPSv3 runtime:\n" + "\n".join(errors[-15:])
        )


def ensure_official_runtime(build_dir: Path = BUILD_DIR) -> OfficialRuntime:
    """The official environment, built on first use and reused while its pins are unchanged."""
    home = build_dir / _spec_key()
    venv, src, stamp = home / "venv", home / "src", home / "ready"
    runtime = OfficialRuntime(python=venv / "bin" / "python", src=src)
    if stamp.exists() and runtime.python.exists() and (src / "hpsv3").is_dir():
        return runtime
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    pip = [str(runtime.python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run_pip([*pip, "install", "--quiet", *OFFICIAL_REQUIREMENTS], "installing the official runtime")
    wheels = home / "wheel"
    _run_pip([*pip, "download", "--quiet", "--no-deps", OFFICIAL_PACKAGE, "-d", str(wheels)], f"downloading {OFFICIAL_PACKAGE}")
    (wheel,) = wheels.glob("hpsv3-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(src)
    stamp.write_text(json.dumps({"requirements": OFFICIAL_REQUIREMENTS, "package": OFFICIAL_PACKAGE}) + "\n")
    return runtime


def official_outputs(runtime: OfficialRuntime, workdir: Path, dtypes: tuple[str, ...], env: dict[str, str]) -> dict:
    """mu/sigma of the official code for the parity cases, made here and now: ``prepare`` writes the
    tiny model and images with this interpreter, ``official`` scores them in the official one."""
    script = REPO / "bench" / "hpsv3_official_reference.py"
    prep = subprocess.run(
        [sys.executable, str(script), "prepare", str(workdir)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    if prep.returncode != 0:
        raise RuntimeError(f"prepare failed:\n{prep.stderr[-3000:]}")
    clean_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # the official interpreter imports nothing of ours
    done = subprocess.run(
        [str(runtime.python), str(script), "official", str(workdir), "--hpsv3-src", str(runtime.src), "--dtypes", ",".join(dtypes)],
        cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the official code failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def pinned_env() -> dict[str, str]:
    """This process's environment with the CPU kernels pinned (tasks/hpsv3/cpu.py). A child that
    makes numbers records the machine it runs on: a recorded machine's facts (IMAGEBENCH_CPU_FACTS)
    do not follow it there."""
    from tasks.hpsv3.cpu import CPU_FACTS_ENV, PINNED_CPU_ENV

    return {**{k: v for k, v in os.environ.items() if k != CPU_FACTS_ENV}, **PINNED_CPU_ENV}


def main() -> None:
    """`python -m tests.tasks.hpsv3.official_runtime [--write-fixture]`: build the runtime ahead of the
    tests; with --write-fixture, also rewrite the committed float32 fixture from the official code."""
    import argparse
    import tempfile

    from .official_parity import FIXTURE

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--write-fixture", action="store_true")
    args = parser.parse_args()
    runtime = ensure_official_runtime()
    print(f"official runtime: {runtime.python}")
    if args.write_fixture:
        with tempfile.TemporaryDirectory() as tmp:
            out = official_outputs(runtime, Path(tmp), ("float32",), pinned_env())
        FIXTURE.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
