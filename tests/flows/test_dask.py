"""Scale-out on Dask: one setting picks the runner, HPSv3 tasks ask for a GPU, same lake either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.flows.conftest import PROMPT_IDS, REPO, SUITE_FILE, put_model, use_workspace
from tests.lakecompare import assert_same_lake

# ---- unit: the setting --------------------------------------------------------------------------


@pytest.fixture()
def runner_env(monkeypatch):
    for key in ("IMAGEBENCH_TASK_RUNNER", "IMAGEBENCH_DASK_ADDRESS", "IMAGEBENCH_DASK_WORKERS", "IMAGEBENCH_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_task_runner_setting_selects_the_runner(runner_env, tmp_path):
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    from flows import runners

    assert isinstance(runners.task_runner(), ThreadPoolTaskRunner)

    runner_env.setenv("IMAGEBENCH_TASK_RUNNER", "dask")
    local = runners.task_runner()
    assert isinstance(local, DaskTaskRunner)
    assert local.address is None
    assert local.cluster_class == "distributed.LocalCluster"
    assert local.cluster_kwargs["n_workers"] == 2 and local.cluster_kwargs["processes"] is True
    assert local.cluster_kwargs["resources"] == {"GPU": 1}
    # Prefect duplicates the runner for every flow run: the local cluster's settings survive it.
    assert local.duplicate().cluster_kwargs == local.cluster_kwargs
    assert type(local.duplicate()) is type(local)  # ... and so does the runner's own submit

    runner_env.setenv("IMAGEBENCH_DASK_WORKERS", "3")
    assert runners.task_runner().cluster_kwargs["n_workers"] == 3
    assert runners.task_runner(workers=5).cluster_kwargs["n_workers"] == 5

    runner_env.setenv("IMAGEBENCH_DASK_ADDRESS", "tcp://10.1.2.3:8786")
    remote = runners.task_runner()
    assert isinstance(remote, DaskTaskRunner) and remote.address == "tcp://10.1.2.3:8786"
    assert not remote.cluster_kwargs

    # The same keys in the IMAGEBENCH_CONFIG YAML file, as for every other setting.
    for key in ("IMAGEBENCH_TASK_RUNNER", "IMAGEBENCH_DASK_ADDRESS", "IMAGEBENCH_DASK_WORKERS"):
        runner_env.delenv(key)
    config = tmp_path / "imagebench.yaml"
    config.write_text("task_runner: dask\ndask_workers: 4\n")
    runner_env.setenv("IMAGEBENCH_CONFIG", str(config))
    from_yaml = runners.task_runner()
    assert isinstance(from_yaml, DaskTaskRunner) and from_yaml.cluster_kwargs["n_workers"] == 4
    from schemas.settings import load_settings

    assert load_settings().task_runner == "dask"  # the runner and the Settings agree


def test_unknown_task_runner_is_a_clear_error(runner_env):
    from flows import runners

    runner_env.setenv("IMAGEBENCH_TASK_RUNNER", "spark")
    with pytest.raises(runners.TaskRunnerConfigError, match=r"IMAGEBENCH_TASK_RUNNER='spark'.*'threads' or 'dask'") as exc:
        runners.task_runner()
    assert "'spark'" in str(exc.value)
    with pytest.raises(ValueError, match="IMAGEBENCH_TASK_RUNNER"):
        runners.task_runner("ray")
    runner_env.setenv("IMAGEBENCH_TASK_RUNNER", "dask")
    runner_env.setenv("IMAGEBENCH_DASK_WORKERS", "many")
    with pytest.raises(ValueError, match="IMAGEBENCH_DASK_WORKERS='many'"):
        runners.task_runner()


@pytest.mark.slow
def test_flows_take_their_runner_from_the_environment_at_import():
    """A deployment's process imports flows.pipeline with its own environment: that picks the runner."""
    code = (
        "from flows.pipeline import nightly_flow, score_model_flow, reference_build_flow\n"
        "from prefect_dask import DaskTaskRunner\n"
        "print(' '.join(str(isinstance(f.task_runner, DaskTaskRunner)) for f in (nightly_flow, score_model_flow, reference_build_flow)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEBENCH_")}
    env.update(IMAGEBENCH_TASK_RUNNER="dask", PREFECT_LOGGING_LEVEL="WARNING")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"] * 3

    env["IMAGEBENCH_TASK_RUNNER"] = "bogus"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "IMAGEBENCH_TASK_RUNNER" in out.stderr and "'bogus'" in out.stderr


_EMBEDDED_API_PROBE = """
import json
import os
from pathlib import Path
from flows.env import prepare_prefect_env
prepare_prefect_env(Path(os.environ["PREFECT_HOME"]).parent)  # as a command: the API requires its secret
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.context import get_run_context
from flows import runners

@task
def where():
    with get_client(sync_client=True) as client:
        return os.getpid(), str(client.api_url)

@flow(task_runner=runners.task_runner("dask", workers=1))
def probe():
    futures = [where.submit() for _ in range(2)]
    seen = [f.result() for f in futures]
    with get_client(sync_client=True) as client:
        return os.getpid(), str(client.api_url), seen, get_run_context().flow_run.id

def task_run_states(run_id):
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    return sorted(r.state.name for r in runs)

if __name__ == "__main__":
    import time
    pid, url, seen, run_id = probe()
    assert all(p != pid for p, _ in seen), (pid, seen)          # the tasks ran in worker processes
    assert {u for _, u in seen} == {url}, (url, seen)            # ... against the flow's own API
    deadline = time.monotonic() + 60                             # ... which recorded them (task run
    while (states := task_run_states(run_id)) != ["Completed", "Completed"] and time.monotonic() < deadline:
        time.sleep(0.5)                                          # states arrive as events)
    assert states == ["Completed", "Completed"], states
    print("OK", url)
"""


@pytest.mark.slow
def test_workers_report_to_the_embedded_api(tmp_path):
    """`IMAGEBENCH_TASK_RUNNER=dask imagebench nightly` without a Prefect server: the flow process
    starts the embedded API; its worker processes must report there, not start servers of their own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEBENCH_", "PREFECT_"))}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
    )
    script = tmp_path / "probe.py"
    script.write_text(_EMBEDDED_API_PROBE)
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "OK http://127.0.0.1:" in out.stdout, (out.stdout + out.stderr)[-3000:]
    assert (tmp_path / "prefect" / "api-auth").stat().st_mode & 0o777 == 0o600  # the workers had the secret


def test_gpu_request_annotates_only_under_dask(runner_env):
    import dask

    from flows import runners

    with runners.gpu_request():
        assert dask.get_annotations() == {}
    runner_env.setenv("IMAGEBENCH_TASK_RUNNER", "dask")
    with runners.gpu_request():
        assert dask.get_annotations() == {"resources": {"GPU": 1}}
    assert dask.get_annotations() == {}


# ---- the scheduler's view: which tasks asked for a GPU, and where they ran ----------------------

# Filled by the scheduler plugin that ``dask_setup`` below installs (the scheduler of a
# LocalCluster runs in this process; this module is named in distributed.scheduler.preload).
AUDIT: list[dict] = []
_AUDIT_LOCK = threading.Lock()


def dask_setup(scheduler) -> None:  # a distributed preload hook
    from distributed.diagnostics.plugin import SchedulerPlugin

    class GpuAudit(SchedulerPlugin):
        name = "imagebench-gpu-audit"

        def transition(self, key, start, finish, *args, **kwargs):
            if finish != "processing":
                return
            ts = scheduler.tasks.get(key)
            if ts is None:
                return
            worker = ts.processing_on
            with _AUDIT_LOCK:
                AUDIT.append(
                    {
                        "key": str(key),
                        "resources": dict(ts.resource_restrictions or {}),
                        "worker": worker.address if worker else None,
                        "worker_resources": dict(worker.resources) if worker else {},
                    }
                )

    scheduler.add_plugin(GpuAudit())


def _audited(prefix: str) -> list[dict]:
    return [a for a in AUDIT if a["key"].startswith(prefix)]


@pytest.mark.slow
def test_gpu_requests_only_run_on_the_gpu_worker(prefect_harness):
    """A cluster with one GPU worker and one CPU-only worker: every task submitted under
    gpu_request (as the flows submit HPSv3 batches) carries resources={"GPU": 1} and runs on the
    GPU worker; the others carry nothing. (The nightly test below checks the real HPSv3 tasks.)"""
    import dask
    import distributed
    from prefect import flow, task
    from prefect_dask import DaskTaskRunner

    from flows import runners

    @task(name="gpu-probe")
    def gpu_probe(i: int) -> str:
        return distributed.get_worker().name

    @task(name="cpu-probe")
    def cpu_probe(i: int) -> str:
        return distributed.get_worker().name

    @flow
    def probe() -> tuple[list, list]:
        with runners.gpu_request():
            gpu = [gpu_probe.submit(i) for i in range(6)]
        cpu = [cpu_probe.submit(i) for i in range(6)]
        return [f.result() for f in gpu], [f.result() for f in cpu]

    AUDIT.clear()
    with dask.config.set({"distributed.scheduler.preload": [__name__]}):
        cluster = distributed.SpecCluster(
            scheduler={"cls": distributed.Scheduler, "options": {"dashboard_address": None}},
            workers={
                "gpu-0": {"cls": distributed.Worker, "options": {"nthreads": 2, "resources": {"GPU": 1}}},
                "cpu-0": {"cls": distributed.Worker, "options": {"nthreads": 2}},
            },
        )
    with cluster:
        gpu_workers, cpu_workers = probe.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))()
    assert gpu_workers == ["gpu-0"] * 6
    assert set(cpu_workers) <= {"gpu-0", "cpu-0"}
    gpu = _audited("gpu_probe-")
    assert len(gpu) == 6 and all(a["resources"] == {"GPU": 1} for a in gpu), AUDIT
    cpu = _audited("cpu_probe-")
    assert len(cpu) == 6 and all(a["resources"] == {} for a in cpu), AUDIT


# ---- the nightly flow on a local multi-process cluster: the same lake -----------------------------

FIXED_MTIME_NS = 1_700_000_000_000_000_000


def _use_workspace(root: Path, monkeypatch, tiny_model, reference_from: Path | None = None) -> Path:
    # Several HPSv3 tasks per model, for two workers to share.
    return use_workspace(root, monkeypatch, tiny_model, reference_from, task_batch_size=16)


def _seed(objects: Path, eligible: list[str]) -> None:
    """The same objects, byte for byte and with the same mtimes: the local store's etag is
    size-mtime, and it enters images.source_fingerprint and model_scores.source_fingerprint."""
    text = [p for p in PROMPT_IDS if p.startswith("tr-")]  # Text Rendering: the OCR judge's
    put_model(objects, "alpha", text[:4] + eligible[:40], seed=3)
    put_model(objects, "partial", eligible[40:60], seed=4)
    (objects / "models" / "partial" / f"{eligible[60]}.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    put_model(objects, "tiny", text[4:6] + eligible[:6], seed=5)
    for path in (objects / "models").rglob("*"):
        if path.is_file():
            os.utime(path, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))


def _task_run_names(flow_run_id) -> dict[str, list[str]]:
    """Task run name prefix -> state names, as the Prefect API recorded them. Task run states
    reach the server as events, so wait (up to 60 s) until every run has a final state."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + 60
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), limit=200)
        if all(r.state and r.state.is_final() for r in runs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out: dict[str, list[str]] = {}
    for r in runs:
        out.setdefault(r.name.rsplit("-", 1)[0], []).append(r.state.name if r.state else "?")
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.slow
def test_nightly_on_local_dask_cluster_writes_the_same_lake(
    prefect_harness, tiny_model, tmp_path, monkeypatch, request
):
    import dask
    import torch
    from prefect.task_runners import ThreadPoolTaskRunner

    from tasks.hpsv3.cpu import CPU_FACTS_ENV, load_recorded_machine

    # The cores come from a recorded machine (tests/machines), read the same way by this process and
    # by the Dask workers it spawns: 4, whatever CPU runs the test.
    machine = REPO / "tests" / "machines" / "amd-epyc-7763-avx2.json"
    monkeypatch.setenv(CPU_FACTS_ENV, str(machine))
    request.addfinalizer(lambda threads=torch.get_num_threads(): torch.set_num_threads(threads))

    from flows import runners
    from flows.pipeline import nightly_flow, reference_build_flow
    from tasks.scores.suite import load_suite

    eligible = list(load_suite(SUITE_FILE).eligible_ids)

    # One reference, built once (threads), copied into both workspaces.
    scratch = _use_workspace(tmp_path / "refbuild", monkeypatch, tiny_model)
    reference = tmp_path / "refbuild" / "reference"
    put_model(scratch / "objects", "base-a", eligible, seed=1)
    monkeypatch.setenv("IMAGEBENCH_TASK_BATCH_SIZE", "96")  # 2 tasks: fewer waits for the `gpu` slot
    reference_build_flow("t1", ["base-a"])

    roots = {name: tmp_path / name for name in ("threads", "dask")}
    for name, root in roots.items():
        _seed(root / "home" / "objects", eligible)

    # 1. The default runner (threads), chosen at import from an environment without the setting.
    assert isinstance(nightly_flow.task_runner, ThreadPoolTaskRunner)
    home_t = _use_workspace(roots["threads"], monkeypatch, tiny_model, reference_from=reference)
    state_t = nightly_flow(return_state=True)
    summary_t = state_t.result()

    # 2. The same flow on a local cluster of 2 worker processes.
    home_d = _use_workspace(roots["dask"], monkeypatch, tiny_model, reference_from=reference)
    # The `gpu` tag limit is the Prefect server's, across all workers: one per GPU worker.
    monkeypatch.setenv("IMAGEBENCH_GPU_CONCURRENCY", "2")
    AUDIT.clear()
    with dask.config.set({"distributed.scheduler.preload": [__name__]}):
        state_d = nightly_flow.with_options(task_runner=runners.task_runner("dask", workers=2))(return_state=True)
    summary_d = state_d.result()

    assert sorted(summary_t["scored"]) == sorted(summary_d["scored"]) == ["alpha", "partial", "tiny"]
    # Dask workers start with OMP_NUM_THREADS=1; every scoring process pins IMAGEBENCH_HPSV3_THREADS
    # instead (default: its cores), so both runners score with the same recorded runtime and bits.
    assert_same_lake(home_t / "lake", home_d / "lake", [roots["threads"]], [roots["dask"]])
    from tasks.lake.tables import Lake

    runtimes = set(Lake(home_d / "lake").read("hps_scores")["runtime"].to_pylist())
    assert len(runtimes) == 1 and json.loads(runtimes.pop())["intra_op_threads"] == load_recorded_machine(machine).usable_cores

    # The tasks ran on the cluster's worker processes, and each reported to the Prefect API.
    workers = {a["worker"] for a in AUDIT}
    assert 1 <= len(workers) <= 2, AUDIT  # the local cluster's worker processes, never the flow's
    hps = _audited("hps_batch_task-")  # Dask key: the task function's name + a token
    assert hps and all(a["resources"] == {"GPU": 1} for a in hps), AUDIT
    # The golden-set canary runs once per run, on a GPU worker (where the batches run).
    canary = _audited("canary_task-")
    assert len(canary) == 1 and canary[0]["resources"] == {"GPU": 1}, AUDIT
    others = [a for a in AUDIT if a not in hps and a not in canary]
    assert others and all(a["resources"] == {} for a in others), AUDIT
    runs_t = _task_run_names(state_t.state_details.flow_run_id)
    runs_d = _task_run_names(state_d.state_details.flow_run_id)
    assert runs_d == runs_t
    assert len(runs_d["hpsv3-batch"]) == len(hps) == 6  # 40 + 20 + 6 images in batches of 16: 3 + 2 + 1
    assert all(s == "Completed" for states in runs_d.values() for s in states), runs_d


def test_the_runner_is_chosen_despite_an_unrelated_bad_setting(runner_env):
    """The flows import picks the runner from its own settings: a bad batch size fails the run
    that uses it, with its own message, not every import of the flows."""
    from flows import runners
    from flows.server import LocalServerError, configured_port

    runner_env.setenv("IMAGEBENCH_BATCH_SIZE", "lots")
    runner_env.setenv("IMAGEBENCH_TASK_RUNNER", "threads")
    assert runners.runner_kind() == "threads"
    with pytest.raises(LocalServerError, match=r"IMAGEBENCH_BATCH_SIZE='lots'"):
        configured_port()
    runner_env.delenv("IMAGEBENCH_BATCH_SIZE")
    runner_env.setenv("IMAGEBENCH_PREFECT_PORT", "70000")
    with pytest.raises(LocalServerError, match=r"IMAGEBENCH_PREFECT_PORT='70000': Input should be less than or equal to 65535"):
        configured_port()
    runner_env.setenv("IMAGEBENCH_PREFECT_PORT", "4300")
    assert configured_port() == 4300
