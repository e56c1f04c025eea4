"""The VAB authors' toolkit (eval.py, summarize.py), run as published from its own folder, in a
virtual environment of its own built from the pins of its ``uv.lock``.

The toolkit is not part of the project (it has no license: never copy it here). It lives beside
the checkout, in ``<repo>/../shared/vab-toolkit`` (SOURCE.md there says what it is), or where
``IMAGEBENCH_VAB_TOOLKIT`` points. Its environment is built once per machine under
``build/vab-toolkit/<key>/`` (ignored by git; about half a minute from PyPI): the packages eval.py and
summarize.py import (litellm, datasets, Pillow, python-dotenv) and everything they depend on, at the
exact versions ``uv.lock`` resolved for this interpreter and platform (the lock's dependency graph
walked from the project, markers evaluated here), installed with ``--no-deps`` so pip resolves
nothing of its own. Nothing of it is imported here: the toolkit runs in its own interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLKIT_ENV = "IMAGEBENCH_VAB_TOOLKIT"
BUILD_DIR = REPO / "build" / "vab-toolkit"
INSTALL_TIMEOUT_S = 900
TOOLKIT_FILES = ("eval.py", "summarize.py", "uv.lock")
# eval.py and summarize.py load the release with `load_dataset` and litellm its model list: all of it
# from the local copy, never from the network (SOURCE.md).
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


class ToolkitUnavailable(RuntimeError):
    """The toolkit's environment could not be built (no package index, a failed install)."""


@dataclass(frozen=True)
class Toolkit:
    folder: Path  # eval.py, summarize.py, uv.lock, as published
    python: Path  # the interpreter of its environment


def toolkit_dir() -> Path:
    return Path(os.environ.get(TOOLKIT_ENV) or REPO.parent / "shared" / "vab-toolkit")


def missing_toolkit() -> str | None:
    """Why the toolkit cannot be run here (a skip reason), or None."""
    folder = toolkit_dir()
    missing = [f for f in TOOLKIT_FILES if not (folder / f).is_file()]
    if missing:
        return (f"the VAB authors' toolkit is not at {folder} (missing {', '.join(missing)}): put eval.py, summarize.py "
                f"and uv.lock of github.com/BakeLab/Visual-Aesthetic-Benchmark there, or set {TOOLKIT_ENV}")
    return None


def locked_requirements(lock_file: Path) -> list[str]:
    """``name==version`` of every package the project of ``lock_file`` needs on this interpreter and
    platform: uv.lock's graph walked from the project's dependencies, each edge's marker evaluated
    here, extras followed, a package with several locked versions picked by the edge that names it."""
    from packaging.markers import Marker

    lock = tomllib.loads(lock_file.read_text(encoding="utf-8"))
    packages: dict[str, list[dict]] = {}
    for p in lock["package"]:
        packages.setdefault(p["name"], []).append(p)
    roots = [p for p in lock["package"] if "virtual" in p.get("source", {}) or "editable" in p.get("source", {})]
    if len(roots) != 1:
        raise ToolkitUnavailable(f"{lock_file}: expected one project package, found {[p['name'] for p in roots]}")

    def applies(edge: dict) -> bool:
        return "marker" not in edge or Marker(edge["marker"]).evaluate()

    def target(edge: dict) -> dict:
        found = [p for p in packages[edge["name"]] if edge.get("version") in (None, p["version"])]
        if len(found) != 1:
            raise ToolkitUnavailable(f"{lock_file}: dependency {edge} matches {len(found)} locked packages")
        return found[0]

    chosen: dict[str, str] = {}
    todo = [e for e in roots[0].get("dependencies", []) if applies(e)]
    while todo:
        edge = todo.pop()
        pkg = target(edge)
        if chosen.setdefault(pkg["name"], pkg["version"]) != pkg["version"]:
            raise ToolkitUnavailable(f"{lock_file}: {pkg['name']} needed at {chosen[pkg['name']]} and {pkg['version']}")
        todo += [e for e in pkg.get("dependencies", []) if applies(e)]
        for extra in edge.get("extra", []):
            todo += [e for e in pkg.get("optional-dependencies", {}).get(extra, []) if applies(e)]
    return [f"{name}=={version}" for name, version in sorted(chosen.items())]


def _run_pip(args: list[str], what: str) -> None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ToolkitUnavailable(f"{what}: pip did not finish in {INSTALL_TIMEOUT_S} s (package index unreachable?)") from exc
    if done.returncode != 0:
        errors = [ln for ln in (done.stderr + done.stdout).splitlines() if "WARNING: Location" not in ln]
        raise ToolkitUnavailable(f"{what} failed (exit {done.returncode}); the package index must be reachable to build "
                                 f"the toolkit's environment:\n" + "\n".join(errors[-15:]))


def ensure_toolkit(folder: Path | None = None, build_dir: Path = BUILD_DIR) -> Toolkit:
    """The toolkit with its environment, built on first use and reused while uv.lock is unchanged."""
    folder = Path(folder or toolkit_dir())
    requirements = locked_requirements(folder / "uv.lock")
    key = hashlib.sha256("\n".join([*requirements, f"python{sys.version_info[:2]}"]).encode()).hexdigest()[:12]
    home = build_dir / key
    venv, stamp = home / "venv", home / "ready"
    python = venv / "bin" / "python"
    if stamp.is_file() and python.exists():
        return Toolkit(folder, python)
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run_pip([*pip, "install", "--quiet", "--no-deps", *requirements], "installing the toolkit's locked packages")
    _run_pip([*pip, "check"], "checking the toolkit's environment")
    stamp.write_text(json.dumps({"requirements": requirements}, indent=1) + "\n")
    return Toolkit(folder, python)


def toolkit_env(workdir: Path, **extra: str) -> dict[str, str]:
    """The environment the toolkit runs in: offline, its caches inside ``workdir``, nothing of ours."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")}
    return {**keep, **OFFLINE_ENV, "HOME": str(workdir), "HF_HOME": str(workdir / ".hf"),
            "PYTHONDONTWRITEBYTECODE": "1", **extra}


@dataclass
class Started:
    """A toolkit script running in the background (:func:`start_script`); :meth:`wait` for it."""

    what: str
    proc: subprocess.Popen
    timeout_s: float

    def wait(self) -> subprocess.CompletedProcess:
        try:
            out, err = self.proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise RuntimeError(f"{self.what} did not finish in {self.timeout_s:g} s:\n{out[-2000:]}\n{err[-4000:]}") from None
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.what} failed (exit {self.proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        return subprocess.CompletedProcess(self.proc.args, 0, out, err)


def start_script(toolkit: Toolkit, script: str, args: list[str], workdir: Path, timeout_s: float = 600, **env: str) -> Started:
    """``python <toolkit>/<script> args`` started in ``workdir`` (where the release and results live),
    in the toolkit's own environment; the caller goes on and waits for it later."""
    proc = subprocess.Popen([str(toolkit.python), str(toolkit.folder / script), *args], cwd=workdir,
                            env=toolkit_env(workdir, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Started(f"{script} {' '.join(args)}", proc, timeout_s)


def run_script(toolkit: Toolkit, script: str, args: list[str], workdir: Path, timeout_s: float = 600,
               **env: str) -> subprocess.CompletedProcess:
    """:func:`start_script` and wait: raises naming the script when it fails."""
    return start_script(toolkit, script, args, workdir, timeout_s, **env).wait()
