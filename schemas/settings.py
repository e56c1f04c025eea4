"""One settings object decides where everything lives (workspace, reference, object store, scorer).

Values come from ``IMAGEBENCH_*`` environment variables, then from an optional YAML file named by
``IMAGEBENCH_CONFIG``, then from the workspace's own settings file ``<home>/imagebench.yaml``
(written by ``imagebench demo``; found without exporting anything), then from the defaults below
(the embedded local workspace).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

DEFAULT_BASE_MODEL = "Qwen/Qwen2-VL-7B-Instruct"
DEFAULT_CHECKPOINT = "MizzenAI/HPSv3"  # HF repo holding HPSv3.safetensors
DEFAULT_SUITE_VERSION = "imagebench-v1"
# The reference a scoring run uses unless told otherwise. Build it once with real HPSv3 weights:
# `imagebench reference build --version v1 --baseline baseline.txt` (see docs/REFERENCE.md).
DEFAULT_REFERENCE_VERSION = "v1"
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
GROUP_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}\$?")  # useradd's rule, or a gid


WORKSPACE_SETTINGS_FILE = "imagebench.yaml"  # in the workspace (<home>), below env and IMAGEBENCH_CONFIG
DEFAULT_HOME = Path("data")
# The frozen suite and references shipped beside the code (the checkout's reference/, which `make`
# installs in place), found from this file, not the working directory: a command typed in any
# folder reads the same benchmark definition. IMAGEBENCH_REFERENCE_DIR still overrides it.
SHIPPED_REFERENCE_DIR = Path(__file__).resolve().parents[1] / "reference"


class WorkspaceSettingsSource(PydanticBaseSettingsSource):
    """``<home>/imagebench.yaml``: the settings a workspace carries for every later command in it.

    ``home`` is located from the sources above it (arguments, ``IMAGEBENCH_HOME``, the
    ``IMAGEBENCH_CONFIG`` file) or the default ``./data``; a ``home`` key inside the file is
    ignored (the file cannot move the workspace it lives in).
    """

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        config_file: PydanticBaseSettingsSource | None,
    ):
        super().__init__(settings_cls)
        # Read directly (not through the env source): RunnerSettings has no ``home`` field.
        home = (
            init_settings().get("home")
            or os.environ.get("IMAGEBENCH_HOME")
            or (config_file().get("home") if config_file is not None else None)
            or DEFAULT_HOME
        )
        self.path = Path(os.path.expanduser(str(home))) / WORKSPACE_SETTINGS_FILE

    def get_field_value(self, field, field_name):  # values come from __call__ as a whole
        return None, field_name, False

    def __call__(self) -> dict[str, object]:
        if not self.path.is_file():
            return {}
        import yaml

        try:
            values = yaml.safe_load(self.path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"workspace settings {self.path}: unreadable YAML ({exc})") from None
        if not isinstance(values, dict):
            raise ValueError(f"workspace settings {self.path}: expected a mapping, got {type(values).__name__}")
        return {k: v for k, v in values.items() if k != "home"}


class _EnvThenYaml(BaseSettings):
    """Reads IMAGEBENCH_* from the environment, then the IMAGEBENCH_CONFIG YAML file, then the
    workspace's imagebench.yaml."""

    model_config = SettingsConfigDict(env_prefix="IMAGEBENCH_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("IMAGEBENCH_CONFIG")
        config_source = None
        if config_file:
            if not Path(config_file).is_file():
                raise FileNotFoundError(f"IMAGEBENCH_CONFIG={config_file}: no such file")
            config_source = YamlConfigSettingsSource(settings_cls, yaml_file=config_file)
            sources.append(config_source)
        sources.append(WorkspaceSettingsSource(settings_cls, init_settings, config_source))
        return tuple(sources)


class RunnerSettings(_EnvThenYaml):
    """The settings the flows' task runner is chosen from. flows/runners.py reads them when the
    flows are imported, on their own, so an unrelated bad setting does not break that import."""

    # The task runner: "threads" (one process, the default) or "dask" (prefect-dask:
    # a local multi-process cluster, or the scheduler at dask_address; HPSv3 tasks then request
    # one "GPU" worker resource each, see docs/OPERATIONS.md).
    task_runner: Literal["threads", "dask"] = "threads"
    dask_address: str | None = None
    dask_workers: int = Field(default=2, ge=1, description="local Dask cluster size when no address is given")


class Settings(RunnerSettings):
    """Every setting (the runner's included)."""

    home: Path = Field(default=DEFAULT_HOME, description="workspace: lake, catalog, image cache")
    reference_dir: Path = Field(default=SHIPPED_REFERENCE_DIR, description="frozen suite + references")
    reference_version: str = DEFAULT_REFERENCE_VERSION
    suite_version: str = DEFAULT_SUITE_VERSION
    # Object store: file:///dir, a plain directory, or s3://bucket/prefix. Default: <home>/objects.
    store: str | None = None
    s3_endpoint: str | None = None  # e.g. http://127.0.0.1:8333 for SeaweedFS/MinIO; None = AWS
    s3_region: str | None = None

    hpsv3_base_model: str = DEFAULT_BASE_MODEL
    hpsv3_checkpoint: str = DEFAULT_CHECKPOINT
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # HPSv3 rotary arithmetic (docs/HPSV3.md): "official" = bf16-rounded frequencies, as trained
    # and published, on any dtype; "float32" = exact frequencies (= the official code run in float32).
    hpsv3_rotary: Literal["official", "float32"] = "official"
    batch_size: int = Field(default=8, ge=1, le=1024)
    task_batch_size: int = Field(default=64, ge=1, description="images per Prefect HPSv3 task")
    gpu_concurrency: int = Field(default=1, ge=1)
    # torch intra-op threads for HPSv3, pinned in every process that scores (CLI, in-process flow,
    # Dask worker: Dask sets OMP_NUM_THREADS=1 in its workers) and recorded with each score.
    # 0 = the cores this process may run on (not OMP_NUM_THREADS, which differs by launcher).
    hpsv3_threads: int = Field(default=0, ge=0, le=1024)
    # Processes that decode, resize, patchify and tokenise HPSv3 batches (tasks/hpsv3/pool.py).
    # Unset: on CUDA the cores minus the one driving the device; on CPU 0 (one thread beside the
    # forward, which already uses every core). Same bits for any value (docs/HPSV3.md).
    hpsv3_preprocess_workers: int | None = Field(default=None, ge=0, le=256)
    # The pinned golden set a new reference stores mu for (reference/<name>.jsonl); the canary
    # of a run uses the set named in the reference in force.
    golden_set: str = "golden-v1"

    # Judges: the routing is part of the benchmark definition (reference/judges-routing-<v>.yaml,
    # pinned in SHA256SUMS); the endpoints are this deployment's (YAML, see judges.example.yaml).
    routing_version: str = "v1"
    judges_config: Path | None = None
    judge_task_size: int = Field(default=64, ge=1, description="images per Prefect judge task")
    # Who shares each judge endpoint's limits (concurrency, requests and tokens per minute) in a
    # flow run (docs/JUDGES.md): "auto" = the Prefect server's global limits when the run reports
    # to a server, else lock files of this machine; "local" = this machine's lock files (every
    # judge request of the deployment is sent from here); "prefect" = the server's limits.
    judge_limits: Literal["auto", "local", "prefect"] = "auto"
    bootstrap_resamples: int = Field(default=2000, ge=100)

    # Operations. The port of the local Prefect server `make serve` starts.
    prefect_port: int = Field(default=4200, ge=1, le=65535)
    # A second run touching a model another run is scoring waits this long for it, then refuses.
    model_lock_wait_s: float = Field(default=0.0, ge=0)
    # The lake's own locks (compaction, partitions): a wait longer than this ends, naming the holder
    # (tasks/store/lockfile.py). A catalog refresh of a large lake holds the compaction lock for minutes.
    lake_lock_wait_s: float = Field(default=600.0, ge=0)
    # A Unix group whose members may read the lake and the catalog (nothing else of the workspace:
    # tasks/store/private.py); None = the workspace is its owner's alone.
    share_group: str | None = None
    # Beauty Index panel (tasks/beauty/store.py): None = SQLite (WAL) in each study's folder; a
    # SQLAlchemy URL (postgresql+psycopg://...) when several panel servers share one database.
    panel_database: str | None = None
    # The panel's public base URL (printed links; https: session cookies get `Secure`), and how
    # long a judge's or admin's browser session lasts before the link must be opened again.
    panel_url: str | None = None
    panel_session_days: float = Field(default=28.0, gt=0, le=366)
    # Beauty Index pixel metrics (tasks/beauty/metrics.py): local weights, never downloaded. The
    # FID InceptionV3 state dict (weights-inception-2015-12-05-6726825d.pth) and a CLIP model
    # folder (Hugging Face layout). Unset: a real study gets no pixel metrics (H1/H4 not tested).
    beauty_inception_weights: str | None = None
    beauty_clip_model: str | None = None

    @field_validator("reference_version", "suite_version", "routing_version", "golden_set")
    @classmethod
    def _version_is_a_name(cls, v: str) -> str:
        # Versions become file names (suite-<v>.jsonl, eps-reference-<v>.json) and SQL literals.
        if not VERSION_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid version name (letters, digits, '.', '_', '-'; at most 64)")
        return v

    @field_validator("share_group")
    @classmethod
    def _group_is_a_name(cls, v: str | None) -> str | None:
        if v is not None and not GROUP_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a Unix group name or number")
        return v

    @field_validator("home", "reference_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return Path(os.path.expanduser(str(v)))

    # Derived locations inside the workspace -------------------------------------------------
    @property
    def lake_dir(self) -> Path:
        return self.home / "lake"

    @property
    def catalog_path(self) -> Path:
        return self.home / "imagebench.duckdb"

    @property
    def image_cache_dir(self) -> Path:
        return self.home / "images"

    @property
    def staging_dir(self) -> Path:
        return self.home / "staging"

    @property
    def store_uri(self) -> str:
        return self.store or str((self.home / "objects").resolve())

    @property
    def suite_path(self) -> Path:
        return self.reference_dir / f"suite-{self.suite_version}.jsonl"

    @property
    def reference_path(self) -> Path:
        return self.reference_dir / f"eps-reference-{self.reference_version}.json"

    @property
    def routing_path(self) -> Path:
        return self.reference_dir / f"judges-routing-{self.routing_version}.yaml"

    @property
    def sha256sums_path(self) -> Path:
        return self.reference_dir / "SHA256SUMS"


def load_settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]


def describe_invalid(exc: ValidationError) -> str:
    """One line per invalid setting, named as the user sets it: ``IMAGEBENCH_X='value': why``."""
    return "; ".join(
        f"IMAGEBENCH_{'_'.join(str(p) for p in e['loc']).upper()}={e.get('input')!r}: {e['msg']}" for e in exc.errors()
    )
