"""The frozen EPS reference: built once, pinned by sha256, verified before every scoring run.

``reference/eps-reference-<version>.json`` is created once (``os.link`` of a complete temp file:
it fails if the name exists), made read-only, and its sha256 appended to
``reference/SHA256SUMS`` (sha256sum format: ``<hex>  <filename>``). No code path rewrites it and
there is no force flag: a change is a new version. The prompt suite file is pinned the same way.
See docs/REFERENCE.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from schemas.reference import REFERENCE_FORMAT, GoldenRecord, ReferenceFile, ReferencePrompt, ScorerIdentity, SuiteRef
from tasks.store.durable import fsync_dir
from tasks.scores.eps import reference_medians, table_columns

if TYPE_CHECKING:
    from tasks.scores.suite import Suite

__all__ = [
    "BaselineIncomplete",
    "ReferenceError",
    "ReferenceExists",
    "ReferenceInvalid",
    "ReferenceMissing",
    "ReferenceTampered",
    "ScorerMismatch",
    "SuiteMismatch",
    "SuiteTampered",
    "build_reference",
    "canonical_json",
    "check_scorer",
    "load_reference_mu",
    "pin_suite",
    "read_sha256sums",
    "reference_filename",
    "suite_filename",
    "verify_reference",
    "verify_suite",
]

SUMS_NAME = "SHA256SUMS"
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SUMS_LINE = re.compile(r"^([0-9a-f]{64}) [ *](\S.*)$")


class ReferenceError(RuntimeError):
    """Base class of every reference error."""


class ReferenceExists(ReferenceError):
    """The reference version already exists: versions are immutable."""


class ReferenceMissing(ReferenceError):
    """The reference file does not exist."""


class ReferenceTampered(ReferenceError):
    """The reference file's sha256 does not match reference/SHA256SUMS (or it is not pinned)."""


class ReferenceInvalid(ReferenceError):
    """The reference file does not parse, fails its expectation suite, or is inconsistent."""


class SuiteMismatch(ReferenceError):
    """The reference was built for another prompt suite than the one in force."""


class SuiteTampered(ReferenceError):
    """The suite file's sha256 does not match reference/SHA256SUMS (or it is not pinned)."""


class ScorerMismatch(ReferenceError):
    """Scores come from another scorer identity than the reference's."""


class BaselineIncomplete(ReferenceError, ValueError):
    """A baseline model lacks eligible prompts or has duplicate / non-finite scores."""


# ------------------------------------------------------------------------------------------
# names, hashes, SHA256SUMS
# ------------------------------------------------------------------------------------------


def _check_version(version: str) -> str:
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise ValueError(f"invalid reference version {version!r}: must match {VERSION_RE.pattern}")
    return version


def reference_filename(version: str) -> str:
    return f"eps-reference-{_check_version(version)}.json"


def suite_filename(suite_version: str) -> str:
    return f"suite-{suite_version}.jsonl"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_sha256sums(reference_dir: str | os.PathLike[str]) -> dict[str, str]:
    """``{filename: sha256}`` from ``reference/SHA256SUMS`` (empty when the file is absent). A
    malformed line or a filename pinned twice raises :class:`ReferenceTampered`."""
    path = Path(reference_dir) / SUMS_NAME
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        m = _SUMS_LINE.match(line)
        if not m:
            raise ReferenceTampered(f"{path}:{lineno}: malformed line {line!r}")
        digest, name = m.group(1), m.group(2)
        if name in out:
            raise ReferenceTampered(f"{path}:{lineno}: {name} is pinned twice")
        out[name] = digest
    return out


@contextlib.contextmanager
def _sums_lock(reference_dir: Path) -> Iterator[None]:
    """Serialise check-and-append on SHA256SUMS (an exclusive flock on the file itself)."""
    reference_dir.mkdir(parents=True, exist_ok=True)
    with open(reference_dir / SUMS_NAME, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _append_sum(reference_dir: Path, digest: str, name: str) -> None:
    """Append ``<digest>  <name>`` to SHA256SUMS (caller holds the lock and checked the name)."""
    path = reference_dir / SUMS_NAME
    prefix = ""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                prefix = "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{prefix}{digest}  {name}\n")
        fh.flush()
        os.fsync(fh.fileno())


def canonical_json(ref: ReferenceFile) -> bytes:
    """Canonical bytes of a reference: sorted keys, indent 1, trailing newline."""
    return (json.dumps(ref.model_dump(mode="json"), sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


# ------------------------------------------------------------------------------------------
# suite pinning
# ------------------------------------------------------------------------------------------


def pin_suite(reference_dir: str | os.PathLike[str], suite_path: str | os.PathLike[str]) -> str:
    """Pin ``suite_path`` (a file inside ``reference_dir``) in SHA256SUMS; returns its sha256.

    Idempotent when the pinned hash equals the file's; :class:`SuiteTampered` when the file is
    pinned with another hash (a suite, like a reference, never changes: make a new version)."""
    ref_dir = Path(reference_dir)
    path = Path(suite_path)
    if path.resolve().parent != ref_dir.resolve():
        raise ValueError(f"{path}: a pinned suite file must live in {ref_dir}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: suite file not found")
    digest = _sha256_file(path)
    with _sums_lock(ref_dir):
        pinned = read_sha256sums(ref_dir).get(path.name)
        if pinned == digest:
            return digest
        if pinned is not None:
            raise SuiteTampered(
                f"{path.name} is already pinned in {ref_dir / SUMS_NAME} with sha256 {pinned}, "
                f"but the file now has sha256 {digest}: suites are immutable, make a new version"
            )
        _append_sum(ref_dir, digest, path.name)
    return digest


def verify_suite(reference_dir: str | os.PathLike[str], suite: Suite) -> None:
    """The suite in force must be the pinned one: ``suite.sha256`` (and, when present, the bytes
    of ``reference/suite-<version>.jsonl``) must equal its SHA256SUMS line."""
    ref_dir = Path(reference_dir)
    name = suite_filename(suite.version)
    pinned = read_sha256sums(ref_dir).get(name)
    if pinned is None:
        raise SuiteTampered(f"{name} is not pinned in {ref_dir / SUMS_NAME}: pin it once with pin_suite")
    if suite.sha256 != pinned:
        raise SuiteTampered(f"suite {name}: sha256 {suite.sha256} does not match the pinned {pinned}")
    path = ref_dir / name
    if path.is_file():
        actual = _sha256_file(path)
        if actual != pinned:
            raise SuiteTampered(f"{path}: sha256 {actual} does not match the pinned {pinned}")


# ------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------


def _prompts_frame(prompts: Sequence[ReferencePrompt]) -> Any:
    import pandas as pd

    return pd.DataFrame(
        {
            "prompt_id": pd.Series([p.prompt_id for p in prompts], dtype=object),
            "mu_ref": pd.Series([p.mu_ref for p in prompts], dtype="float64"),
            "n_models": pd.Series([p.n_models for p in prompts], dtype="int64"),
        }
    )


def build_reference(
    *,
    version: str,
    baseline_models: Sequence[str],
    scores: Any,
    suite: Suite,
    scorer: ScorerIdentity,
    reference_dir: str | os.PathLike[str],
    created_at: str,
    golden: GoldenRecord | None = None,
) -> Path:
    """Build ``reference/eps-reference-<version>.json`` once and pin it in SHA256SUMS.

    ``golden``: the golden set's mu under the building runtime (tasks/scores/golden.py), required for
    the built-in scorer so later runs can check their runtime against it (the canary).

    ``scores``: a table (pyarrow / polars / pandas / column mapping / row dicts, see
    :func:`tasks.scores.eps.table_columns`) with columns ``model_id, prompt_id, mu, scorer_id``.
    Every row must come from ``scorer`` (else :class:`ScorerMismatch`); every baseline model must
    have exactly one finite mu for each eligible prompt (else :class:`BaselineIncomplete` naming
    the model). Raises :class:`ReferenceExists` when the version exists (file or SHA256SUMS line):
    the existing bytes are never touched.
    """
    from tasks.lake.validation import ValidationFailed, require_valid

    name = reference_filename(version)
    ref_dir = Path(reference_dir)
    final = ref_dir / name
    immutable = f"reference versions are immutable: pick a new version instead of {version!r}"
    if final.exists():
        raise ReferenceExists(f"{final} already exists; {immutable}")
    if name in read_sha256sums(ref_dir):
        raise ReferenceExists(f"{ref_dir / SUMS_NAME} already pins {name}; {immutable}")

    models = list(baseline_models)
    cols = table_columns(scores, ["model_id", "prompt_id", "mu", "scorer_id"])
    foreign = sorted({str(s) for s in cols["scorer_id"] if s != scorer.scorer_id})
    if foreign:
        n = sum(1 for s in cols["scorer_id"] if s != scorer.scorer_id)
        raise ScorerMismatch(
            f"{n} score row(s) come from scorer id(s) {foreign[:5]}, not from the reference's scorer "
            f"{_describe_identity(scorer)}: a reference is built from one scorer only"
        )
    try:
        medians = reference_medians(cols, models, suite.eligible_ids)
    except ValueError as exc:
        raise BaselineIncomplete(str(exc)) from exc

    prompts = [ReferencePrompt(prompt_id=p, mu_ref=mu, n_models=n) for p, (mu, n) in medians.items()]
    try:
        require_valid("eps_reference", _prompts_frame(prompts))
    except ValidationFailed as exc:
        raise ReferenceInvalid(f"reference {version}: prompt table fails its expectations:\n{exc}") from exc
    ref = ReferenceFile(
        version=version,
        suite=SuiteRef(version=suite.version, sha256=suite.sha256),
        scorer=scorer,
        scorer_id=scorer.scorer_id,
        baseline_models=models,
        created_at=created_at,
        prompts=prompts,
        golden=golden,
    )
    data = canonical_json(ref)
    digest = hashlib.sha256(data).hexdigest()

    ref_dir.mkdir(parents=True, exist_ok=True)
    with _sums_lock(ref_dir):
        if name in read_sha256sums(ref_dir):
            raise ReferenceExists(f"{ref_dir / SUMS_NAME} already pins {name}; {immutable}")
        tmp = ref_dir / f".{name}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o444)
            try:
                os.link(tmp, final)  # atomic create-once: fails if the name exists
            except FileExistsError:
                raise ReferenceExists(f"{final} already exists; {immutable}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        os.chmod(final, 0o444)
        fsync_dir(ref_dir)
        _append_sum(ref_dir, digest, name)
    return final


# ------------------------------------------------------------------------------------------
# verify
# ------------------------------------------------------------------------------------------


def _identity_diff(a: ScorerIdentity, b: ScorerIdentity) -> str:
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    diffs = [f"{k}: reference {da.get(k)!r} vs scorer {db.get(k)!r}" for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)]
    return "; ".join(diffs) if diffs else "no field differs"


def _describe_identity(s: ScorerIdentity) -> str:
    return (
        f"{s.scorer_id} (scorer_name={s.scorer_name!r}, source={s.source!r}, "
        f"checkpoint_sha256={s.checkpoint_sha256!r}, uncalibrated={s.uncalibrated})"
    )


def check_scorer(ref: ReferenceFile, scorer: ScorerIdentity | str) -> None:
    """Raise :class:`ScorerMismatch` unless ``scorer`` (an identity or its ``scorer_id``) is the
    reference's scorer; with an identity, the message lists each differing field."""
    if isinstance(scorer, ScorerIdentity):
        if scorer.scorer_id != ref.scorer_id:
            raise ScorerMismatch(
                f"reference {ref.version} was built by scorer {_describe_identity(ref.scorer)}; this run's "
                f"scorer is {_describe_identity(scorer)}. Differences: {_identity_diff(ref.scorer, scorer)}. "
                "Scores from another scorer are not comparable with this reference."
            )
    elif scorer != ref.scorer_id:
        raise ScorerMismatch(
            f"reference {ref.version} was built by scorer {_describe_identity(ref.scorer)}; this run's "
            f"scorer id is {scorer!r}. Scores from another scorer are not comparable with this reference."
        )


def verify_reference_file(reference_dir: str | os.PathLike[str], version: str) -> Path:
    """The cheap part of :func:`verify_reference` (no parsing, no Great Expectations): the file
    of reference ``version`` exists and its sha256 equals its SHA256SUMS line. Its path."""
    ref_dir = Path(reference_dir)
    name = reference_filename(version)
    path = ref_dir / name
    if not path.is_file():
        raise ReferenceMissing(
            f"{path}: EPS reference {version!r} not found. Build it once from a baseline field with "
            f"`imagebench reference build --version {version} --baseline baseline.txt` (docs/REFERENCE.md)"
        )
    pinned = read_sha256sums(ref_dir).get(name)
    actual = _sha256_file(path)
    if pinned is None:
        raise ReferenceTampered(
            f"{path} is not pinned in {ref_dir / SUMS_NAME} (actual sha256 {actual}): a reference is "
            "only trusted with its SHA256SUMS line (an interrupted build? see docs/REFERENCE.md)"
        )
    if actual != pinned:
        raise ReferenceTampered(
            f"{path} was modified: expected sha256 {pinned} (SHA256SUMS), actual {actual}. "
            f"{_restore_hint(path, version)}; never edit a reference."
        )
    return path


DEMO_REFERENCE_VERSION = "demo"  # what `imagebench demo` builds in its workspace (flows/demo.py)
_COMMITTED_REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"


def _restore_hint(path: Path, version: str) -> str:
    """How to get a modified reference back. Only the committed ./reference is under version
    control; a workspace's reference (the demo's, under $IMAGEBENCH_HOME, git-ignored) is not."""
    ref_dir = path.parent
    if ref_dir.resolve() == _COMMITTED_REFERENCE_DIR:
        return f"Restore the file from version control (git checkout -- reference/{path.name})"
    if version == DEMO_REFERENCE_VERSION:
        return (
            f"It is the demo's reference, built by `imagebench demo` in its workspace and not under version "
            f"control: delete {ref_dir} and run `make demo` again to rebuild it"
        )
    return (
        f"{ref_dir} is not this checkout's version-controlled reference/: restore the file from where this "
        "reference was published or backed up (the sha256 above must match)"
    )


def verify_reference(
    reference_dir: str | os.PathLike[str],
    version: str,
    suite: Suite,
    expected_scorer_id: str | None = None,
    *,
    expected_scorer: ScorerIdentity | None = None,
) -> ReferenceFile:
    """Load and check ``reference/eps-reference-<version>.json`` before it is used.

    In order: the file exists (:class:`ReferenceMissing`); its sha256 equals its SHA256SUMS line
    (:class:`ReferenceTampered`); it parses and validates (:class:`ReferenceInvalid`, also for the
    ``eps_reference`` expectation suite); it was built for the suite in force, version and sha256
    (:class:`SuiteMismatch`) and its prompt ids equal ``suite.eligible_ids`` exactly; its scorer
    is ``expected_scorer_id`` / ``expected_scorer`` when given (:class:`ScorerMismatch`).
    """
    from tasks.lake.validation import ValidationFailed, require_valid

    path = verify_reference_file(reference_dir, version)
    _refuse_old_format(path)
    try:
        ref = ReferenceFile.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ReferenceInvalid(f"{path}: not a valid reference file: {exc}") from exc
    if ref.version != version:
        raise ReferenceInvalid(f"{path}: declares version {ref.version!r}, expected {version!r}")
    if ref.scorer_id != ref.scorer.scorer_id:
        raise ReferenceInvalid(
            f"{path}: scorer_id {ref.scorer_id} does not match its scorer identity ({ref.scorer.scorer_id})"
        )
    bad = [p.prompt_id for p in ref.prompts if not math.isfinite(p.mu_ref)]
    if bad:
        raise ReferenceInvalid(f"{path}: non-finite mu_ref for {bad[:5]}")
    try:
        require_valid("eps_reference", _prompts_frame(ref.prompts))
    except ValidationFailed as exc:
        raise ReferenceInvalid(f"{path}: prompt table fails its expectations:\n{exc}") from exc

    if ref.suite.version != suite.version or ref.suite.sha256 != suite.sha256:
        raise SuiteMismatch(
            f"reference {version} was built for suite {ref.suite.version} (sha256 {ref.suite.sha256}); "
            f"the suite in force is {suite.version} (sha256 {suite.sha256})"
        )
    ids = [p.prompt_id for p in ref.prompts]
    if ids != list(suite.eligible_ids):
        missing = [p for p in suite.eligible_ids if p not in set(ids)]
        extra = [p for p in ids if p not in set(suite.eligible_ids)]
        raise SuiteMismatch(
            f"reference {version}: prompt ids differ from the suite's {len(suite.eligible_ids)} eligible "
            f"prompts: missing {missing[:5]} ({len(missing)}), extra {extra[:5]} ({len(extra)})"
            + ("; same ids in another order" if not missing and not extra else "")
        )
    if expected_scorer is not None:
        check_scorer(ref, expected_scorer)
    if expected_scorer_id is not None:
        check_scorer(ref, expected_scorer_id)
    return ref


def _refuse_old_format(path: Path) -> None:
    """A reference of an older format is never rewritten or migrated: it is refused by name."""
    try:
        declared = json.loads(path.read_bytes()).get("format")
    except (ValueError, AttributeError):
        return  # not JSON: the validation below names the problem
    if declared != REFERENCE_FORMAT and isinstance(declared, str) and declared.startswith("imagebench-eps-reference/"):
        raise ReferenceInvalid(
            f"{path}: format {declared!r}, this imagebench reads {REFERENCE_FORMAT!r} (format 1 bound the "
            "transformers version and dtype into the scorer identity and has no golden set). The file "
            "stays as it is: build a new reference version (docs/REFERENCE.md)"
        )


def load_reference_mu(ref: ReferenceFile) -> dict[str, float]:
    """``{prompt_id: mu_ref}`` of a verified reference."""
    return {p.prompt_id: float(p.mu_ref) for p in ref.prompts}
