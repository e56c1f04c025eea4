"""`vab run --prompt vab-official-v1` beside the authors' own eval.py and summarize.py (issue 25).

The toolkit runs as published, from its folder (tests/vab/toolkit_runtime.py: ``../shared/vab-toolkit``
or ``IMAGEBENCH_VAB_TOOLKIT``), in an environment built from the pins of its uv.lock, offline, reading
a local release laid out as ``BakeLab/Visual-Aesthetic-Benchmark/data/test-*.parquet`` in its working
folder. The release has PNG, JPEG and WEBP images in RGB, RGBA, P and L modes and one 2600x1700
image. eval.py and imagebench (with the endpoint's DEFAULT settings: only backend, model and
base_url configured) each talk to their own fake OpenAI-compatible server on loopback
(tests/fake_openai.py) that logs every request and answers from its content alone (the text, the
decoded pixels of every image in order, the temperature), scripted per content: unreadable
answers (every attempt, or the first), HTTP 500/503 on some attempts, answers naming one image
best and worst, a first ``BEST:`` that is not the last. Then, request by request (text, decoded
pixels, image order, every sampling parameter, how many times each was sent and the waits between
them) and summary by summary (summarize.py's JSON and table against `vab summarize`), they must be
the same. A second server gives different answers to identical requests (trials at temperature 1
are separate samples): the same requests, the same numbers, and a rerun that sends nothing and
gives the same numbers again."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import threading
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from tests.fake_openai import FakeOpenAI, RecordedRequest, Reply
from tests.vab import toolkit_runtime as tk

pytestmark = pytest.mark.skipif(tk.missing_toolkit() is not None, reason=tk.missing_toolkit() or "")

HF_NAME = "BakeLab/Visual-Aesthetic-Benchmark"
MODEL = "fake-vab"  # eval.py --model openai/fake-vab: summarize.py names it fake-vab, the server sees fake-vab
VARY = "fake-vary"
# (task id, release domain, substyle, image kinds in stored order, ground truth best, worst)
TASKS = [
    ("vab-t01", "fine-art", "oil", ["png", "webp"], "B", "A"),
    ("vab-t02", "illustration", "ink", ["p", "l"], "A", "B"),
    ("vab-t03", "photograph", "street", ["jpeg", "rgba", "webp"], "C", "A"),
    ("vab-t04", "fine-art", "watercolour", ["big", "png", "p", "l"], "A", "D"),
    ("vab-t05", "illustration", "flat", ["rgba", "webp-alpha", "jpeg", "png", "p"], "D", "B"),
    ("vab-t06", "photograph", "portrait", ["png", "jpeg", "webp", "l", "rgba", "p"], "B", "F"),
    ("vab-t07", "photograph", "landscape", ["jpeg", "rgba"], "A", "B"),
    ("vab-t08", "fine-art", "still-life", ["webp", "l", "png"], "B", "C"),
    ("vab-t09", "illustration", "comic", ["p", "jpeg", "rgba"], "A", "C"),
]
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


# ---- the release -------------------------------------------------------------------------------
def _pixels(seed: int, size: tuple[int, int]) -> np.ndarray:
    """A smooth picture of its own per seed (gradients and rings: small once compressed)."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = (x / w * 255 + seed * 29) % 256
    g = (y / h * 255 + seed * 53) % 256
    b = (np.hypot(x - w / 2, y - h / 2) / 3 + seed * 71) % 256
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def image_bytes(kind: str, seed: int) -> bytes:
    size = (2600, 1700) if kind == "big" else (96 + 8 * seed, 64 + 5 * seed)
    rgb = Image.fromarray(_pixels(seed, size), "RGB")
    buf = io.BytesIO()
    if kind == "png":
        rgb.save(buf, format="PNG")
    elif kind in ("jpeg", "big"):
        rgb.save(buf, format="JPEG", quality=92)
    elif kind == "webp":
        rgb.save(buf, format="WEBP", quality=80)
    elif kind in ("rgba", "webp-alpha"):  # the colour under a transparent pixel is kept: eval.py's RGB drops alpha
        alpha = Image.fromarray(((np.arange(size[0])[None, :] * 255 // size[0]) * np.ones((size[1], 1))).astype(np.uint8), "L")
        rgba = rgb.copy()
        rgba.putalpha(alpha)
        rgba.save(buf, format="PNG" if kind == "rgba" else "WEBP", lossless=True)
    elif kind == "p":
        pal = rgb.quantize(colors=48)
        pal.info["transparency"] = 0
        pal.save(buf, format="PNG", transparency=0)
    elif kind == "l":
        rgb.convert("L").save(buf, format="PNG")
    else:
        raise ValueError(kind)
    return buf.getvalue()


def write_release(workdir: Path, tasks=TASKS) -> Path:
    """The release as Hugging Face stores it (features in the Parquet metadata), where eval.py's
    ``load_dataset("BakeLab/Visual-Aesthetic-Benchmark", split="test")`` finds it: in its cwd."""
    cols: dict[str, list] = {k: [] for k in ("task_id", "domain", "substyle", "n_images", "images", "labels",
                                             "ground_truth_best", "ground_truth_worst")}
    seed = 0
    for tid, domain, substyle, kinds, best, worst in tasks:
        labels = [chr(65 + i) for i in range(len(kinds))]
        images = []
        for k in kinds:
            seed += 1
            images.append({"bytes": image_bytes(k, seed), "path": f"{tid}-{seed}.{'jpg' if k in ('jpeg', 'big') else 'webp' if 'webp' in k else 'png'}"})
        for key, value in (("task_id", tid), ("domain", domain), ("substyle", substyle), ("n_images", len(kinds)),
                           ("images", images), ("labels", labels), ("ground_truth_best", best), ("ground_truth_worst", worst)):
            cols[key].append(value)
    types = {"n_images": pa.int64(), "images": pa.list_(IMAGE), "labels": pa.list_(pa.string())}
    table = pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()})
    features = {k: {"dtype": "string", "_type": "Value"} for k in cols}
    features.update(n_images={"dtype": "int64", "_type": "Value"}, images={"feature": {"_type": "Image"}, "_type": "List"},
                    labels={"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"})
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    folder = workdir / HF_NAME
    (folder / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "data" / "test-00000-of-00001.parquet")
    return folder


# ---- the fake server's view of a request --------------------------------------------------------
_DECODED: dict[str, dict] = {}
_DECODED_LOCK = threading.Lock()


def decoded(url: str) -> dict:
    """What an image part carries: its media type and its decoded pixels (mode, size, sha256);
    each distinct data URL decoded once (the server sees the same images over and over)."""
    tag = hashlib.sha256(url.encode()).hexdigest()
    with _DECODED_LOCK:
        if tag in _DECODED:
            return _DECODED[tag]
    head, b64 = url.split(",", 1)
    with Image.open(io.BytesIO(base64.b64decode(b64))) as im:
        im.load()
        out = {"media": head, "format": im.format, "mode": im.mode, "size": list(im.size),
               "pixels": hashlib.sha256(im.tobytes()).hexdigest()}
    with _DECODED_LOCK:
        _DECODED[tag] = out
    return out


def content(req: RecordedRequest) -> list:
    parts = req.body["messages"][-1]["content"]
    return [["text", p["text"]] if p["type"] == "text" else ["image", decoded(p["image_url"]["url"])] for p in parts]


def content_key(req: RecordedRequest) -> str:
    """The request's content: text parts and decoded images in order, and the temperature asked."""
    return hashlib.sha256(json.dumps([content(req), req.body.get("temperature")], sort_keys=True).encode()).hexdigest()


def params(req: RecordedRequest) -> dict:
    """Everything in the body but the messages (model, token limit, temperature, seed...)."""
    return {k: v for k, v in req.body.items() if k != "messages"}


class Scripted:
    """Answers from the content alone (and, for ``vary``, how many times that content was asked):

    - deterministic (``vary=False``): a bucket of the content's hash picks the behaviour: an answer
      nobody can read in any attempt; for 3+ images (each request of a run is unique) an unreadable
      first answer, six HTTP 500s before an answer, an unreadable answer then three HTTP 503s; an
      answer naming one image best and worst; a first ``BEST:`` that is not the last; a lower-case
      letter; otherwise a plain answer;
    - ``vary=True``: a readable answer whose letters move on with every identical request (a model
      sampled at temperature 1)."""

    def __init__(self, vary: bool = False, plain: bool = False) -> None:
        self.vary, self.plain = vary, plain  # plain: a readable answer from the content alone, always
        self.seen: Counter = Counter()
        self.lock = threading.Lock()
        self.buckets: Counter = Counter()

    def __call__(self, req: RecordedRequest) -> Reply:
        key = content_key(req)
        three = len(content(req)) > 6  # 3+ images: the question and 2 parts per image
        with self.lock:
            count = self.seen[key]
            self.seen[key] += 1
            self.buckets[(self.bucket(req, key), three, count)] += 1
        return self.reply(req, key, count)[0]

    def bucket(self, req: RecordedRequest, key: str) -> int:
        bucket = (int(key, 16) >> 40) % 10
        if bucket in (1, 2, 3) and req.body.get("temperature") != 1.0:
            return 8  # the scripted retries once, at temperature 1 (each costs eval.py's 2 s and 5 s sleeps)
        return bucket

    def reply(self, req: RecordedRequest, key: str, count: int) -> tuple[Reply, str]:
        """The answer to the ``count``-th request of this content, and what it is to eval.py:
        ``ok``, ``unreadable`` (a parse failure) or ``error``."""
        parts = content(req)
        text = parts[0][1]
        n = sum(1 for p in parts if p[0] == "image")
        labs = [chr(65 + i) for i in range(n)]
        both = "and which has the worst" in text
        worst_only = not both and "worst overall" in text
        h = int(key, 16)
        best, worst = labs[h % n], labs[(h // 7) % n]
        if self.vary:
            best, worst = labs[(h + count) % n], labs[(h // 7 + count) % n]
            return Reply(text=self.answer(best, worst, both, worst_only)), "ok"
        if self.plain:
            return Reply(text=self.answer(best, worst, both, worst_only)), "ok"
        bucket = self.bucket(req, key)
        if bucket == 0:
            return Reply(text="Each of them has its own charm; I would not rank them."), "unreadable"
        if n >= 3 and bucket == 1 and count == 0:
            return Reply(text="Let me think about it.\nBEST: none of them"), "unreadable"
        if n >= 3 and bucket == 2 and count < 6:
            return Reply(status=500, text=None), "error"
        if n >= 3 and bucket == 3 and count == 0:
            return Reply(text="Hard to say."), "unreadable"
        if n >= 3 and bucket == 3 and count < 4:
            return Reply(status=503, text=None), "error"
        if both and bucket in (4, 5):
            worst = best  # one image named best and worst: eval.py reads it and scores it
        if bucket == 6:
            other = labs[(h // 11) % n]
            head = f"At first BEST: {other} seemed right, then I looked again.\n"
            return Reply(text=head + self.answer(best, worst, both, worst_only)), "ok"
        if bucket == 7:
            return Reply(text=self.answer(best.lower(), worst.lower(), both, worst_only)), "ok"
        return Reply(text=self.answer(best, worst, both, worst_only)), "ok"

    @staticmethod
    def answer(best: str, worst: str, both: bool, worst_only: bool) -> str:
        reasoning = "Composition, colour, technique and expression considered in turn.\n"
        if both:
            return reasoning + f"BEST: {best}\nWORST: {worst}"
        return reasoning + (f"WORST: {worst}" if worst_only else f"BEST: {best}")


def log_of(server: FakeOpenAI) -> dict[str, list[RecordedRequest]]:
    """The server's completions grouped by content, each group in arrival order."""
    out: dict[str, list[RecordedRequest]] = defaultdict(list)
    for r in sorted(server.completions, key=lambda r: r.t):
        out[content_key(r)].append(r)
    return out


def describe(reqs: list[RecordedRequest]) -> str:
    r = reqs[0]
    parts = content(r)
    images = [f"{p[1]['media']} {p[1]['mode']} {p[1]['size']}" for p in parts if p[0] == "image"]
    return f"{len(reqs)}x {parts[0][1][:60]!r} images {images} params {params(r)}"


def least_waits(kinds: list[str]) -> list[float]:
    """The shortest wait eval.py allows before each request after the first, given what the ones
    before were (one trial): 2 s, then 5 s, before a new attempt (after an unreadable answer, or an
    attempt's third error); its HTTP client's retries within an attempt 0.375 s, then 0.75 s."""
    out, errors, attempt = [], 0, 0
    for kind in kinds[:-1]:
        if kind == "error":
            errors += 1
        if kind == "unreadable" or errors == 3:
            out.append((2.0, 5.0)[attempt])
            attempt, errors = attempt + 1, 0
        else:
            out.append(0.375 * 2 ** (errors - 1))
    return out


def compare_requests(theirs: dict[str, list[RecordedRequest]], ours: dict[str, list[RecordedRequest]],
                     script: Scripted | None = None) -> None:
    """The same contents, each sent as many times, with the same parameters, and (with ``script``,
    for one trial's requests) at least the waits eval.py makes between them, on both sides (a lower
    bound: a loaded machine waits longer, never shorter)."""
    only_theirs = [describe(v) for k, v in theirs.items() if k not in ours]
    only_ours = [describe(v) for k, v in ours.items() if k not in theirs]
    assert not only_theirs and not only_ours, (f"eval.py sent {len(only_theirs)} request content(s) imagebench did not, e.g. "
                                               f"{only_theirs[:3]}; imagebench sent {len(only_ours)} eval.py did not, e.g. {only_ours[:3]}")
    for key, sent in theirs.items():
        got = ours[key]
        assert len(got) == len(sent), f"eval.py sent this {len(sent)} times, imagebench {len(got)}: {describe(sent)}"
        assert [params(r) for r in got] == [params(r) for r in sent], describe(sent)
        for a, b in zip(sent, got):  # the same text and pixels: by the key; the same JSON shape of each part
            assert [(p["type"], sorted(p)) for p in a.body["messages"][-1]["content"]] == \
                   [(p["type"], sorted(p)) for p in b.body["messages"][-1]["content"]]
            assert [m["role"] for m in a.body["messages"]] == [m["role"] for m in b.body["messages"]] == ["user"]
        if script is None or len(sent) == 1 or sum(p[0] == "image" for p in content(sent[0])) < 3:
            continue  # 2 images: two trials may be shown in the same order, two requests of their own
        least = least_waits([script.reply(r, key, k)[1] for k, r in enumerate(sent)])
        for who, side in (("eval.py", sent), ("imagebench", got)):
            waits = [y.t - x.t for x, y in zip(side, side[1:])]
            # Compared largest to largest: a try the loopback loses under load (the client's own
            # retry, unseen by the server) shifts which request a wait precedes, never the waits.
            assert all(w >= m for w, m in zip(sorted(waits, reverse=True), sorted(least, reverse=True))), \
                (who, waits, least, describe(sent))


# ---- the runs -----------------------------------------------------------------------------------
def _cli(*args):
    from flows.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _summary_text(stdout: str) -> str:
    """What summarize.py prints from its summary on (its loading lines and the 'Saved to' left out)."""
    start = stdout.index("\n" + "=" * 80)
    body = stdout[start:]
    return body.split("\nSaved to ")[0].rstrip("\n") + "\n"


@pytest.fixture(scope="module")
def toolkit() -> tk.Toolkit:
    try:
        return tk.ensure_toolkit()
    except tk.ToolkitUnavailable as exc:
        pytest.fail(f"the toolkit's environment could not be built: {exc}")


@contextlib.contextmanager
def workspace(work: Path, judges: dict[str, str]):
    """An imagebench workspace in ``work`` whose endpoints config has ``judges`` (name -> base_url,
    the model named as the judge) with the endpoint's defaults: nothing but backend, model, base_url."""
    cfg = work / "judges.yaml"
    cfg.write_text(yaml.safe_dump({"judges": {name: {"backend": "openai", "model": name, "base_url": url} for name, url in judges.items()}}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGEBENCH_HOME", str(work / "home"))
        mp.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
        for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_REFERENCE_DIR"):
            mp.delenv(key, raising=False)
        yield


def trials_of(sets: str) -> list[dict]:
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.vab.tables import read_partition

    return read_partition(Lake(load_settings().lake_dir), "vab_trials", sets).to_pylist()


def eval_py(toolkit: tk.Toolkit, work: Path, server: FakeOpenAI, models: list[str], out: str, *extra: str) -> tk.Started:
    """eval.py started in the background (imagebench runs meanwhile, in this process)."""
    args = [a for m in models for a in ("--model", f"openai/{m}")]
    return tk.start_script(toolkit, "eval.py", [*args, "--api-base", server.base_url, "--api-key", "sk-local-test",
                                                "--output-dir", out, "--concurrency", "64", *extra], work, HF_HOME=str(work / f".hf-{out}"))


@pytest.fixture(scope="module")
def side_by_side(prefect_harness, toolkit, tmp_path_factory):
    """eval.py and imagebench on the same release, at temperature 1 (the default) and 0, each
    against its own scripted server; summarize.py on eval.py's files; imagebench's collections:
    ``ours`` (its runs), ``evalpy`` (eval.py's files imported)."""
    work = tmp_path_factory.mktemp("vab-toolkit")
    release = write_release(work)
    servers = {"eval": FakeOpenAI(MODEL, Scripted()), "ours": FakeOpenAI(MODEL, Scripted())}
    started: list[tk.Started] = []
    for s in servers.values():
        s.start()
    try:
        started += [eval_py(toolkit, work, servers["eval"], [MODEL], "results"),
                    eval_py(toolkit, work, servers["eval"], [MODEL], "results-t0", "--temperature", "0")]
        with workspace(work, {MODEL: servers["ours"].base_url}):
            for name in ("ours", "evalpy"):
                assert _cli("vab", "import-sets", release, "--name", name).exit_code == 0
            runs = [_cli("vab", "run", "--sets", "ours", "--judge", MODEL, "--prompt", "vab-official-v1"),
                    _cli("vab", "run", "--sets", "ours", "--judge", MODEL, "--prompt", "vab-official-v1", "--temperature", "0")]
            for e in started:
                e.wait()
            started = [tk.start_script(toolkit, "summarize.py", ["--results-dir", "results", "--t0-dir", "results-t0", "-o", "summary.json"],
                                       work, HF_HOME=str(work / ".hf-results")),
                       tk.start_script(toolkit, "summarize.py", ["--results-dir", "results-t0", "--t0-dir", "none", "-o", "summary-t0.json"],
                                       work, HF_HOME=str(work / ".hf-results-t0"))]
            imports = [_cli("vab", "import-results", work / "results" / f"{MODEL}.json", "--sets", "evalpy"),
                       _cli("vab", "import-results", work / "results-t0" / f"{MODEL}.json", "--sets", "evalpy", "--judge", f"{MODEL}@t0")]
            out = {"ours": {}, "evalpy": {}}
            for name in out:
                out[name]["json"] = _cli("vab", "summarize", "--sets", name, "--format", "json")
                out[name]["t0"] = _cli("vab", "summarize", "--sets", name, "--t0")
            rows = trials_of("ours")
        summary = started[0].wait()
        started[1].wait()
        yield {"work": work, "eval_log": log_of(servers["eval"]), "ours_log": log_of(servers["ours"]), "runs": runs,
               "imports": imports, "summaries": out, "summarize_stdout": summary.stdout, "rows": rows,
               "official": json.loads((work / "summary.json").read_text()),
               "official_t0": json.loads((work / "summary-t0.json").read_text()),
               "results": json.loads((work / "results" / f"{MODEL}.json").read_text()),
               "buckets": servers["eval"].responder.buckets, "script": Scripted()}
    finally:
        for e in started:
            if e.proc.poll() is None:
                e.proc.kill()
                e.proc.wait()
        for s in servers.values():
            s.stop()


def test_the_release_and_the_script_cover_what_the_issue_names(side_by_side) -> None:
    """Not a tautology: the comparison below is only worth something if eval.py met every case."""
    seen = side_by_side["buckets"]
    for bucket in (0, 1, 2, 3, 4, 6, 7):
        assert any(b == bucket and (three or bucket not in (1, 2, 3)) for b, three, _ in seen), \
            f"no request fell in bucket {bucket}: change the release"
    answers = side_by_side["results"]["results"]
    same = [r for r in answers if r["prompt_type"] == "pick_best_and_worst" and r.get("parsed_answer")
            and r["parsed_answer"]["best"] == r["parsed_answer"]["worst"]]
    assert same, "eval.py read no answer naming one image best and worst"
    assert any(r.get("parsed_answer") is None for r in answers), "no unreadable answer"
    modes = {p[1]["mode"] for reqs in side_by_side["eval_log"].values() for p in content(reqs[0]) if p[0] == "image"}
    sizes = {tuple(p[1]["size"]) for reqs in side_by_side["eval_log"].values() for p in content(reqs[0]) if p[0] == "image"}
    assert modes == {"RGB"} and (2600, 1700) in sizes  # eval.py sends RGB JPEG, never resized


def test_requests_are_eval_pys(side_by_side) -> None:
    """Text, decoded pixels (RGB JPEG quality 85, never resized), image order, max_tokens 8192,
    no seed, temperature 1 and 0, and the retries: 3 attempts shared by unreadable answers and
    errors, 2 s and 5 s apart, each attempt as eval.py's HTTP client sends it."""
    for r in side_by_side["runs"]:
        assert r.exit_code == 0, r.output
    theirs, ours = side_by_side["eval_log"], side_by_side["ours_log"]
    assert {json.dumps(params(r), sort_keys=True) for v in theirs.values() for r in v} == {
        json.dumps({"model": MODEL, "max_tokens": 8192, "temperature": t}, sort_keys=True) for t in (1.0, 0.0)}
    compare_requests(theirs, ours, side_by_side["script"])
    script = side_by_side["script"]
    three = {k: v for k, v in theirs.items() if sum(p[0] == "image" for p in content(v[0])) >= 3}  # one trial per content
    assert any(5.0 in least_waits([script.reply(r, k, i)[1] for i, r in enumerate(v)]) for k, v in three.items())


def test_summaries_are_summarize_pys(side_by_side) -> None:
    """summarize.py's JSON on eval.py's file = `vab summarize --format json` of imagebench's own run
    and of eval.py's file imported as it is (answers naming one image twice included); its table
    with --t0-dir = `vab summarize --t0` (the run at temperature 0 kept beside, not replacing)."""
    for r in side_by_side["imports"]:
        assert r.exit_code == 0, r.output
    official, official_t0 = side_by_side["official"], side_by_side["official_t0"]
    for name in ("ours", "evalpy"):
        mine = _json(side_by_side["summaries"][name]["json"])
        assert list(mine) == ["Random Guess", MODEL, f"{MODEL}@t0"]
        assert mine["Random Guess"] == official["Random Guess"]
        assert mine[MODEL] == official[MODEL], name
        assert mine[f"{MODEL}@t0"] == official_t0[MODEL], name
        table = side_by_side["summaries"][name]["t0"]
        assert table.exit_code == 0, table.output
        assert table.stdout == _summary_text(side_by_side["summarize_stdout"]), name
    same = [r for r in side_by_side["rows"] if r["prompt_type"] == "pick_best_and_worst" and r["state"] == "ok" and r["best"] == r["worst"]]
    assert same and all(r["response"] for r in side_by_side["rows"] if r["state"] != "error")  # the full answer is kept


# ---- trials at temperature 1 are separate samples -------------------------------------------------
@pytest.fixture(scope="module")
def varying(prefect_harness, toolkit, tmp_path_factory):
    work = tmp_path_factory.mktemp("vab-vary")
    release = write_release(work)
    servers = {"eval": FakeOpenAI(VARY, Scripted(vary=True)), "ours": FakeOpenAI(VARY, Scripted(vary=True))}
    for s in servers.values():
        s.start()
    started = eval_py(toolkit, work, servers["eval"], [VARY], "results")
    try:
        with workspace(work, {VARY: servers["ours"].base_url}):
            assert _cli("vab", "import-sets", release, "--name", "vary").exit_code == 0
            first = _cli("vab", "run", "--sets", "vary", "--judge", VARY, "--prompt", "vab-official-v1")
            sent_first = len(servers["ours"].completions)
            log_first = log_of(servers["ours"])
            summary_first = _cli("vab", "summarize", "--sets", "vary", "--format", "json")
            again = _cli("vab", "run", "--sets", "vary", "--judge", VARY, "--prompt", "vab-official-v1")
            sent_again = len(servers["ours"].completions) - sent_first
            summary_again = _cli("vab", "summarize", "--sets", "vary", "--format", "json")
        started.wait()
        started = tk.start_script(toolkit, "summarize.py", ["--results-dir", "results", "--t0-dir", "none", "-o", "summary.json"],
                                  work, HF_HOME=str(work / ".hf-results"))
        started.wait()
        yield {"eval_log": log_of(servers["eval"]), "ours_log": log_first, "runs": (first, again), "sent_again": sent_again,
               "summaries": (summary_first, summary_again), "official": json.loads((work / "summary.json").read_text())}
    finally:
        if started.proc.poll() is None:
            started.proc.kill()
            started.proc.wait()
        for s in servers.values():
            s.stop()


def test_every_trial_is_its_own_request_and_a_rerun_gives_the_same_numbers(varying) -> None:
    for r in varying["runs"]:
        assert r.exit_code == 0, r.output
    theirs, ours = varying["eval_log"], varying["ours_log"]
    assert any(len(v) > 1 for v in theirs.values())  # two trials shown in the same order: sent twice, answered apart
    compare_requests(theirs, ours)
    first, again = (_json(s) for s in varying["summaries"])
    # the same answers, though two identical requests may have met them in the other order: the same
    # numbers (to the last float digit or so: the per-trial shares are summed in another order)
    from tests.vab.test_official import _close

    _close(first[VARY], varying["official"][VARY])
    assert varying["sent_again"] == 0  # every trial's answer cached under its own trial
    assert again == first


# ---- what litellm sends for other model names, and eval.py's --prompt-type ----------------------------
# gpt-5 and the o-series get max_completion_tokens, and no temperature unless it is 1 (gpt-5.1: any);
# an o-named model litellm does not list, and gpt-5-chat, are ordinary chat models
MODELS = ["gpt-5-mini", "o3-mini", "gpt-5.1", "gpt-5-chat-latest", "o1-custom", "gpt-4o-mini"]
SMALL = [("vab-m1", "photograph", "street", ["rgba", "p", "webp"], "B", "C"), ("vab-m2", "photograph", "portrait", ["l", "jpeg"], "A", "B")]


@pytest.fixture(scope="module")
def models(prefect_harness, toolkit, tmp_path_factory):
    work = tmp_path_factory.mktemp("vab-models")
    release = write_release(work, SMALL)
    servers = {side: FakeOpenAI("any", Scripted(plain=True)) for side in ("eval", "ours")}
    for s in servers.values():
        s.start()
    started = [eval_py(toolkit, work, servers["eval"], MODELS, "results", "--prompt-type", "pick_worst"),
               eval_py(toolkit, work, servers["eval"], MODELS, "results-t0", "--prompt-type", "pick_worst", "--temperature", "0")]
    try:
        with workspace(work, {m: servers["ours"].base_url for m in MODELS}):
            assert _cli("vab", "import-sets", release, "--name", "m").exit_code == 0
            judges = [a for m in MODELS for a in ("--judge", m)]
            runs = [_cli("vab", "run", "--sets", "m", *judges, "--prompt", "vab-official-v1", "--prompt-type", "pick_worst"),
                    _cli("vab", "run", "--sets", "m", *judges, "--prompt", "vab-official-v1", "--prompt-type", "pick_worst",
                         "--temperature", "0")]
            summary = _cli("vab", "summarize", "--sets", "m", "--format", "json")
            refused = _cli("vab", "run", "--sets", "m", "--judge", MODELS[0], "--prompt-type", "pick_worst")  # our prompt: one question
        for e in started:
            e.wait()
        started = [tk.start_script(toolkit, "summarize.py", ["--results-dir", "results", "--t0-dir", "none", "-o", "summary.json"],
                                   work, HF_HOME=str(work / ".hf-results"))]
        started[0].wait()
        yield {"eval_log": log_of(servers["eval"]), "ours_log": log_of(servers["ours"]), "runs": runs, "summary": summary,
               "refused": refused, "official": json.loads((work / "summary.json").read_text())}
    finally:
        for e in started:
            if e.proc.poll() is None:
                e.proc.kill()
                e.proc.wait()
        for s in servers.values():
            s.stop()


def test_parameters_follow_the_model_name_as_litellm_sends_them(models) -> None:
    for r in models["runs"]:
        assert r.exit_code == 0, r.output
    theirs, ours = models["eval_log"], models["ours_log"]
    texts = {content(r)[0][1].split("\n")[2] for v in theirs.values() for r in v}
    assert texts == {"Which image has the worst overall aesthetic quality?"}  # --prompt-type pick_worst: nothing else asked
    for model in MODELS:  # the same requests, model by model (the content key leaves the model out)
        compare_requests({k: [r for r in v if r.body["model"] == model] for k, v in theirs.items() if any(r.body["model"] == model for r in v)},
                         {k: [r for r in v if r.body["model"] == model] for k, v in ours.items() if any(r.body["model"] == model for r in v)})
    sent = {(r.body["model"], json.dumps(params(r), sort_keys=True)) for v in theirs.values() for r in v}
    assert ("gpt-5-mini", json.dumps({"model": "gpt-5-mini", "max_completion_tokens": 8192}, sort_keys=True)) in sent  # t=0 dropped
    assert ("gpt-4o-mini", json.dumps({"model": "gpt-4o-mini", "max_tokens": 8192, "temperature": 0.0}, sort_keys=True)) in sent


def test_a_pick_worst_run_scores_as_summarize_py_and_nothing_else_shows_as_0(models) -> None:
    """summarize.py gives a pick_worst-only run 0 for pick_best and pick_best_and_worst, and for the
    domains without a task: imagebench says absent (null) there, and the same everywhere else."""
    from tests.vab.test_official import _close

    def absent(path: str) -> bool:
        no_task = "/fine-art/" in path or "/illustration/" in path
        return no_task or not (path.endswith("/pick_worst") or path.endswith("/pick_worst/accuracy"))

    mine, official = _json(models["summary"]), models["official"]
    assert set(mine) == {"Random Guess", *MODELS, *(f"{m}@t0" for m in MODELS)}  # the t=0 runs beside, not replacing
    for model in MODELS:
        _close(mine[model], official[model], f"/{model}", absent=absent)
    assert mine[MODELS[0]]["pick_best"] == {"accuracy": None}
    assert models["refused"].exit_code == 1 and "needs --prompt vab-official-v1" in models["refused"].output
