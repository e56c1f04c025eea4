"""Fixtures for real Prefect flow runs on a temporary workspace with the tiny HPSv3 model."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

REPO = Path(__file__).resolve().parents[2]
SUITE_FILE = REPO / "reference" / "suite-imagebench-v1.jsonl"
ROUTING_FILE = REPO / "reference" / "judges-routing-v1.yaml"


# prefect_harness (one Prefect test server per session) is in tests/conftest.py: tests/beauty uses it too.


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> tuple[Path, Path]:
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny-hpsv3")
    base, ckpt = root / "base", root / "HPSv3-tiny.safetensors"
    write_tiny_base_model(base)
    write_tiny_checkpoint(base, ckpt, seed=0)
    return base, ckpt


@pytest.fixture(scope="session")
def other_tiny_checkpoint(tiny_model, tmp_path_factory) -> Path:
    from tasks.hpsv3.tiny import write_tiny_checkpoint

    path = tmp_path_factory.mktemp("tiny-hpsv3-other") / "HPSv3-tiny-seed1.safetensors"
    write_tiny_checkpoint(tiny_model[0], path, seed=1)
    return path


def _suite_ids() -> list[str]:
    from tasks.scores.suite import load_suite

    return [p.prompt_id for p in load_suite(SUITE_FILE).prompts]


PROMPT_IDS = _suite_ids()


def cli_process(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m flows.cli ARGS` in its own process; wide columns so that Rich never folds a
    line (a folded secret would slip past a substring scan)."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=REPO, env={**env, "COLUMNS": "10000"},
        capture_output=True, text=True, timeout=timeout,
    )


def image_bytes(seed: int, side: int = 96, fmt: str = "PNG") -> bytes:
    """A small deterministic image: a smooth colour field plus seeded noise."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, size=3)
    yy, xx = np.mgrid[0:side, 0:side]
    arr = (base[None, None, :] + 0.5 * xx[..., None] * rng.uniform(0, 1) + rng.normal(0, 20, (side, side, 3)))
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def put_model(objects: Path, model_id: str, prompt_ids, seed: int) -> None:
    d = objects / "models" / model_id
    d.mkdir(parents=True, exist_ok=True)
    for i, pid in enumerate(prompt_ids):
        (d / f"{pid}.png").write_bytes(image_bytes(seed * 10_000 + i))


def use_workspace(
    root: Path, monkeypatch, tiny_model, reference_from: Path | None = None, task_batch_size: int = 48
) -> Path:
    """Point IMAGEBENCH_* at ``root/home`` and ``root/reference`` (the suite and routing copied
    and pinned, or a copy of ``reference_from``, an already built reference dir)."""
    from tasks.runs import pinned
    from tasks.scores.golden import copy_golden_set
    from tasks.scores.reference import pin_suite

    home, refdir = root / "home", root / "reference"
    if reference_from is not None:
        shutil.copytree(reference_from, refdir)
    else:
        refdir.mkdir(parents=True)
        for src in (SUITE_FILE, ROUTING_FILE):
            shutil.copyfile(src, refdir / src.name)
            pin_suite(refdir, refdir / src.name)
        copy_golden_set(SUITE_FILE.parent, refdir)  # a new reference stores its mu (the canary)
    base, ckpt = tiny_model
    for key, value in {
        "IMAGEBENCH_HOME": str(home),
        "IMAGEBENCH_REFERENCE_DIR": str(refdir),
        "IMAGEBENCH_REFERENCE_VERSION": "t1",
        "IMAGEBENCH_HPSV3_BASE_MODEL": str(base),
        "IMAGEBENCH_HPSV3_CHECKPOINT": str(ckpt),
        "IMAGEBENCH_DEVICE": "cpu",
        "IMAGEBENCH_BATCH_SIZE": "8",
        "IMAGEBENCH_TASK_BATCH_SIZE": str(task_batch_size),
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_JUDGES_CONFIG", "IMAGEBENCH_TASK_RUNNER",
                "IMAGEBENCH_DASK_ADDRESS", "IMAGEBENCH_DASK_WORKERS"):
        monkeypatch.delenv(key, raising=False)
    pinned.scorer_identity.cache_clear()
    return home


@pytest.fixture()
def workspace(tmp_path, monkeypatch, tiny_model) -> Path:
    """A fresh IMAGEBENCH_HOME with its own reference dir (suite copied and pinned)."""
    return use_workspace(tmp_path, monkeypatch, tiny_model)


def eligible_ids() -> list[str]:
    from tasks.scores.suite import load_suite

    return list(load_suite(SUITE_FILE).eligible_ids)


@pytest.fixture(scope="session")
def built_reference_template(prefect_harness, tiny_model, tmp_path_factory) -> Path:
    """Built once per session: a workspace whose reference "t1" was built by a real flow run
    from two baseline models. Tests get a copy (:func:`built_reference`), never this one."""
    from flows.pipeline import reference_build_flow

    root = tmp_path_factory.mktemp("built-reference")
    with pytest.MonkeyPatch.context() as mp:
        home = use_workspace(root, mp, tiny_model)
        put_model(home / "objects", "base-a", eligible_ids(), seed=1)
        put_model(home / "objects", "base-b", eligible_ids(), seed=2)
        reference_build_flow("t1", ["base-a", "base-b"])
    return root


@pytest.fixture()
def built_reference(built_reference_template, tmp_path, monkeypatch, tiny_model):
    """A workspace of its own (a copy of :func:`built_reference_template`: the reference "t1",
    the baselines' objects, lake rows and run record), with IMAGEBENCH_* pointing at it.
    Returns (home, objects dir, reference file)."""
    from schemas.settings import load_settings
    from tasks.runs import pinned, units_aggregate

    home = tmp_path / "home"
    shutil.copytree(built_reference_template / "home", home)  # keeps mtimes: the listing is unchanged
    use_workspace(tmp_path, monkeypatch, tiny_model, reference_from=built_reference_template / "reference")
    settings = load_settings()
    settings.catalog_path.unlink()
    units_aggregate.refresh(settings, pinned.load_pinned_suite(settings))  # its views name this workspace's lake
    return home, home / "objects", settings.reference_path


IMAGEBENCH = [str(Path(sys.executable).parent / "imagebench")]


def runs_of(settings) -> list[dict]:
    """The workspace's run records, oldest first."""
    from tasks.lake.tables import Lake

    return sorted(Lake(settings.lake_dir).read_runs().to_pylist(), key=lambda r: r["started_at"])


def score_cli(home: Path, model: str, cli: list[str] = IMAGEBENCH, **extra_env: str) -> subprocess.Popen:
    """`imagebench score --model MODEL` for the workspace ``home``, in a session of its own: a kill
    can go to the whole process group (CLI + its embedded Prefect server), as when a machine or
    container dies. Output to a file (``proc.log_path``): a full pipe would block the run, and a
    child a dead run leaves behind would hold a pipe open."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(IMAGEBENCH_HOME=str(home), PREFECT_HOME=str(home / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="WARNING")
    env.update(extra_env)  # the caller's values win
    log_path = home.parent / f"cli-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*cli, "score", "--model", model, "--format", "json"], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log_path
    return proc


class StalledEndpoint:
    """An HTTP endpoint that takes every connection and never answers: a judge's request to it
    waits for its whole timeout, in a task thread the flow waits for."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def judges_config(self, path: Path) -> Path:
        """An endpoints config whose two routed judges both ask this endpoint (600 s timeout)."""
        import json

        path.write_text(json.dumps({"judges": {name: {"backend": "openai", "base_url": self.url, "model": name,
                                                      "timeout_s": 600, "max_retries": 0}
                                               for name in ("qwen3-vl", "gemma")}}))
        return path

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()
