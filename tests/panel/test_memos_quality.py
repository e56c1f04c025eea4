"""Memos through to the open-data bundle (issue 16 item 5, issue 27 item 1) and quality-control
evidence through to the analysis (issue 16 item 9), over the real app on loopback, the real
analysis and the real export command."""

from __future__ import annotations

import json
import re

import httpx
import pyarrow.parquet as pq
import pytest
import yaml

from tasks.beauty.store import PanelStore
from tests.panel.audio import encoded_audio
from tests.panel.conftest import REPO, TOOLS, beauty_prompt_ids, make_settings, serve, write_study, write_tool_images


def _current(page: str) -> tuple[int, str]:
    pos = int(re.search(r'name="position" value="(\d+)"', page).group(1))
    img = re.search(r'name="image_id" value="([^"]+)"', page).group(1)
    return pos, img


def _memo(c: httpx.Client, pos: int, data: bytes, publish: bool = False) -> str:
    r = c.post(f"/memo?position={pos}&consent=1&publish={int(publish)}", content=data, headers={"Content-Type": "audio/webm"})
    assert r.status_code == 200, r.text
    return r.json()["memo_id"]


def _decoded_seconds_and_tags(data: bytes) -> tuple[float, dict, dict]:
    import io

    import av

    with av.open(io.BytesIO(data)) as c:
        (stream,) = c.streams
        samples = sum(f.samples for f in c.decode(stream))
        return samples / stream.codec_context.sample_rate, dict(c.metadata), dict(stream.metadata)


def test_only_memos_consented_for_publication_leave_unlinked_and_stripped(tmp_path, monkeypatch):
    """Issue 27 item 1 (and issue 16 items 5 and 9), over the real app on loopback, the real
    analysis and the real export command. j1 records, at its first image, a take it abandons and
    then one it sends, ticking the separate box to publish it; the recorder left a name in the
    file's tags. At its second image a take with that box ticked is abandoned (a reload); at its
    third a memo is kept without it. The bundle holds exactly the one recording consented for
    publication, re-encoded with no tag, named by no judge, linked to no answer; the memo kept
    without that consent stays with the lab; the datasheet says which and why. Quality control:
    j2 answers its first image without loading it."""
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.beauty import publish
    from tasks.beauty.sources import collect_answers, load_study_context
    from tests.panel.audio import tagged_webm

    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    for key, value in {"IMAGEBENCH_HOME": str(tmp_path), "IMAGEBENCH_REFERENCE_DIR": str(REPO / "reference"),
                       "IMAGEBENCH_STORE": str(tmp_path / "objects")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("IMAGEBENCH_PANEL_DATABASE", raising=False)
    settings = make_settings(tmp_path)
    judges = [("j1", "photographers"), ("j2", "aphantasia")]
    write_study(settings, "memos", judges)
    path = tmp_path / "studies" / "memos" / "study.yaml"
    data = yaml.safe_load(path.read_text())
    data["analysis"] = {"bootstrap_resamples": 100, "permutations": 100}
    data["quality"] = {"min_seconds_on_screen": 3600}  # every loaded image is answered "too fast" here
    path.write_text(yaml.safe_dump(data))
    from tasks.beauty.study import open_study

    opened = open_study(settings, "memos")
    tags = {"title": "Jane Roe, photographer", "artist": "Jane Roe"}
    takes = {"first": encoded_audio("webm", 1.0), "published": tagged_webm(2.0, tags),
             "orphan": tagged_webm(1.5, tags), "kept": encoded_audio("webm", 3.0)}
    assert b"Jane Roe" in takes["published"] and b"Lavf" in takes["published"]  # what a recorder leaves in a file
    with serve(settings, "memos") as s:
        for label, _ in judges:
            with httpx.Client(base_url=s.url, follow_redirects=False, timeout=30) as c:
                c.get(f"/j/{opened.judge_tokens[label]}")
                while "You have answered every image" not in (page := c.get("/judge").text):
                    pos, img = _current(page)
                    memo_id = ""
                    if label == "j1" and pos == 0:
                        assert 'id="publish-consent"' in page  # the separate box, on the page
                        _memo(c, pos, takes["first"])  # recorded, then the judge reloads the page ...
                        assert _current(c.get("/judge").text) == (pos, img)
                        memo_id = _memo(c, pos, takes["published"], publish=True)  # ... and records again: sent
                    if label == "j1" and pos == 1:
                        _memo(c, pos, takes["orphan"], publish=True)  # recorded, then a reload lost it
                    if label == "j1" and pos == 2:
                        memo_id = _memo(c, pos, takes["kept"])  # kept with the answer, not for publication
                    if not (label == "j2" and pos == 0):  # j2 answers its first image without loading it
                        assert c.get(f"/img/{img}").status_code == 200
                    r = c.post("/answer", data={"position": pos, "image_id": img, "answer": "yes" if pos % 2 else "no",
                                                "memo_id": memo_id})
                    assert r.status_code == 303

    store = PanelStore.open(opened.study_dir)
    every = store.memo_rows(linked_only=False)
    assert len(every) == 4
    linked = store.memo_rows()
    assert [(m["position"], m["publish_consent_at"] is not None) for m in linked] == [(0, True), (2, False)]
    assert linked[0]["publish_consent_at"] == linked[0]["uploaded_at"]  # the consent, recorded with its time
    store.dispose()

    ctx = load_study_context(settings, "memos")
    answers = collect_answers(settings, ctx)
    assert answers.column("image_loaded").to_pylist().count(False) == 1
    tables = publish.analyze(settings, ctx, answers, mixed_resamples=2)
    publish.validate(tables)
    publish.write(settings, tables)
    flags = tables.tables["study_answers"].column("qc_flag").to_pylist()
    assert flags.count("image not loaded") == 1 and flags.count("faster than 3600 s") == len(flags) - 1
    assert any("quality control: 40 of 40 answers flagged" in n for n in tables.notes)
    index = tables.tables["study_index"].to_pylist()
    assert sum(r["flagged_answers"] for r in index if r["panel_group"] == "all") == 40
    assert all(r["beauty_index_unflagged"] is None for r in index)  # nothing left without them

    # Two judges in two groups: each alone in theirs, so the export needs the groups merged.
    bundle = tmp_path / "bundle"
    r = CliRunner().invoke(app, ["study", "export", "--study", "memos", "--out", str(bundle), "--times", "none",
                                 "--merge-groups", "photographers+aphantasia"])
    assert r.exit_code == 0, r.output
    (published,) = sorted((bundle / "memos").iterdir())
    sound = published.read_bytes()
    seconds, container_tags, stream_tags = _decoded_seconds_and_tags(sound)
    assert abs(seconds - 2.0) < 0.05  # the published take's sound, not another take's
    assert container_tags == {} and stream_tags == {}
    for leak in (b"Jane", b"Lavf", b"Lavc", b"webm"):
        assert leak not in sound, leak
    judge_ids = set(pq.read_table(bundle / "answers.parquet").column("judge_id").to_pylist())
    assert published.suffix == ".ogg" and not any(j[:8] in published.name for j in judge_ids)
    # No link from any answer to a memo, and nothing in the bundle names the recording but its file.
    exported = pq.read_table(bundle / "answers.parquet")
    assert "memo_file" not in exported.column_names and "memo" not in exported.column_names
    listed = [line.split("  ", 1)[1] for line in (bundle / "SHA256SUMS").read_text().splitlines()]
    mentions = [name for name in listed if name != f"memos/{published.name}"
                and published.stem.encode() in (bundle / name).read_bytes()]
    assert mentions == []
    sheet = (bundle / "datasheet.md").read_text()
    assert "2 memo(s) were kept by the lab with the judge's consent" in sheet
    assert "1 of them are in `memos/`" in sheet and "a voice can identify a person" in sheet
    memo_counts = json.loads((bundle / "anonymity.json").read_text())["memos"]
    assert memo_counts == {"kept_by_the_lab": 2, "published": 1}


@pytest.mark.parametrize("min_seconds,expect", [(0.0, [None, None, "image not loaded"]), (5.0, ["faster than 5 s", None, "image not loaded"])])
def test_flag_rule(min_seconds, expect):
    from tasks.beauty.quality import qc_flag

    got = [qc_flag(True, 1.0, min_seconds), qc_flag(None, None, min_seconds), qc_flag(False, None, min_seconds)]
    assert got == expect
    assert qc_flag(True, 5.0, 5.0) is None  # at the threshold is not faster than it


def test_unflagged_index_is_the_index_of_the_kept_answers():
    """With some answers flagged, the 'without' column is exactly the index computed on the others."""
    import pyarrow as pa

    from schemas.study import STUDY_ANSWERS
    from tasks.beauty import analysis, quality

    rows = []
    for j in range(4):
        for t in ("a", "b"):
            for p in ("p1", "p2"):
                fast = j == 0 and t == "a"
                rows.append({"study_id": "s", "judge_id": f"j{j}", "panel_group": "photographers", "tool": t, "prompt_id": p,
                             "image_id": None, "position": None, "answer": (j + (t == "a")) % 2 == 0,
                             "shown_at": None, "answered_at": None, "memo": False, "source": "panel",
                             "image_loaded": True, "seconds_on_screen": 0.2 if fast else 4.0, "qc_flag": None})
    from datetime import UTC, datetime

    for r in rows:
        r["shown_at"] = r["answered_at"] = datetime(2026, 1, 1, tzinfo=UTC)
    answers = quality.flag_answers(pa.Table.from_pylist(rows, schema=STUDY_ANSWERS), 1.0)
    assert quality.flag_counts(answers) == {"faster than 1 s": 2}
    compute = lambda a: analysis.beauty_index(a, 100, 7, False)  # noqa: E731
    both = quality.with_unflagged_index(compute(answers), answers, compute)
    kept = compute(answers.filter(pa.compute.is_null(answers.column("qc_flag"))))
    want = {(r["tool"], r["panel_group"]): r["beauty_index"] for r in kept.to_pylist()}
    for r in both.to_pylist():
        assert r["beauty_index_unflagged"] == want[(r["tool"], r["panel_group"])]
        assert r["flagged_answers"] == (2 if r["tool"] == "a" else 0)
    assert [r["beauty_index"] for r in both.to_pylist()] != [r["beauty_index_unflagged"] for r in both.to_pylist()]
