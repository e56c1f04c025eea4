"""A Beauty study page whose "HPSv3 mu" column comes from the demo's uncalibrated HPSv3 weights says
so (issue 26 item 7): the column carries an UNCALIBRATED mark and the page a banner, as every
ImageBench output of such weights does; with calibrated weights neither. The pixel metrics are
computed by the real scorer (the tiny HPSv3-architecture model: uncalibrated, and the same weights
saved without that flag), the study analysed and its page built as `imagebench report` does."""

from __future__ import annotations

import datetime as dt
import re
from html import unescape

import numpy as np
import pyarrow as pa
import pytest
import yaml
from PIL import Image

TOOLS = ("tool-alpha", "tool-beta", "tool-gamma")
STUDY = "hps-mark"
T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.timezone.utc)


def _answers(prompt_ids: list[str]) -> pa.Table:
    from schemas.study import STUDY_ANSWERS

    rows = [{"study_id": STUDY, "judge_id": f"{j:016x}", "panel_group": "photographers", "tool": tool,
             "prompt_id": pid, "image_id": None, "position": None, "answer": (j + k + t) % 3 == 0,
             "shown_at": T0, "answered_at": T0 + dt.timedelta(seconds=4), "memo": False, "source": "panel",
             "image_loaded": True, "seconds_on_screen": 4.0, "qc_flag": None}
            for j in range(4) for t, tool in enumerate(TOOLS) for k, pid in enumerate(prompt_ids)]
    return pa.Table.from_pylist(rows, schema=STUDY_ANSWERS)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the page's HTML, the study's tables, the pixel metrics of the uncalibrated scorer, those of the calibrated one)."""
    from safetensors.torch import load_file, save_file

    from schemas.settings import load_settings
    from tasks.beauty import metrics as M
    from tasks.beauty import publish
    from tasks.beauty.sources import load_study_context
    from tasks.beauty.study import init_study
    from tasks.hpsv3.scorer import HPSv3Scorer
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint
    from tasks.report.study import build_study_pages

    root = tmp_path_factory.mktemp("study-hps")
    write_tiny_base_model(root / "base")
    write_tiny_checkpoint(root / "base", root / "demo.safetensors", seed=0)  # flagged uncalibrated, as the demo's
    save_file(load_file(root / "demo.safetensors"), root / "calibrated.safetensors")  # same weights, no flag
    rng = np.random.default_rng(0)
    tools = {}
    for k, tool in enumerate(TOOLS):
        tools[tool] = []
        for i in range(3):
            path = root / f"{tool}-{i}.png"
            Image.fromarray(np.clip(rng.normal(100 + 40 * k, 30, (48, 64, 3)), 0, 255).astype(np.uint8)).save(path)
            tools[tool].append(M.ToolImages(path, f"a lighthouse at dusk, take {i}"))
    pixel = {}
    for name in ("demo", "calibrated"):
        hps = HPSv3Scorer.load(str(root / "base"), str(root / f"{name}.safetensors"), device="cpu", dtype="float32")
        networks = M.tiny_random_networks(root / f"nets-{name}", seed=0, hps=hps)
        pixel[name] = M.pixel_metrics(tools, None, networks, study_id=STUDY, resamples=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGEBENCH_HOME", str(root / "home"))
        for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_PANEL_DATABASE", "IMAGEBENCH_REFERENCE_DIR"):
            mp.delenv(key, raising=False)
        settings = load_settings()
        path = init_study(settings, STUDY, list(TOOLS), host_tool=TOOLS[-1])
        data = yaml.safe_load(path.read_text())
        data["analysis"] = {"bootstrap_resamples": 100, "permutations": 100}
        path.write_text(yaml.safe_dump(data))
        ctx = load_study_context(settings, STUDY)
        tables = publish.analyze(settings, ctx, _answers(list(ctx.prompt_ids)), pixel=pixel["demo"], mixed_resamples=2)
        publish.validate(tables)
        publish.write(settings, tables)
        (link,) = build_study_pages(settings, root / "report")
        html = (root / "report" / link.page).read_text(encoding="utf-8")
    return html, tables.tables, pixel["demo"], pixel["calibrated"]


def _header(html: str) -> str:
    head = html.split('id="study-table"', 1)[1].split("</thead>", 1)[0]
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", re.search(r'<th class="hps-mu">(.*?)</th>', head, re.S).group(1))).split())


def test_the_uncalibrated_hpsv3_mu_column_is_marked(built):
    html, _, demo, _ = built
    assert all(r["hps_uncalibrated"] is True and r["hps_mu"] is not None for r in demo.to_pylist())
    assert _header(html) == "HPSv3 mu UNCALIBRATED"
    banners = [" ".join(unescape(b).split()) for b in re.findall(r'<div class="banner uncalibrated"[^>]*>(.*?)</div>', html, re.S)]
    assert any(b.startswith("UNCALIBRATED DEMO WEIGHTS: the HPSv3 mu column") for b in banners), banners
    # the mu in the one number style (3 decimals), as the model pages write it
    cells = re.findall(r'<tr data-tool="[^"]+">(.*?)</tr>', html.split('id="study-table"', 1)[1].split("</table>", 1)[0], re.S)
    mus = [re.findall(r"<td[^>]*>(.*?)</td>", c)[-1] for c in cells]
    want = {f"{r['hps_mu']:.3f}" for r in demo.to_pylist()}
    assert set(mus) == want, (mus, want)


def test_calibrated_weights_carry_no_mark(built):
    from tasks.beauty.metrics import pixel_metrics_notes
    from tasks.report.build import CSP, _env
    from tasks.report.study import hps_uncalibrated, study_page_context

    html, tables, demo, calibrated = built
    assert all(r["hps_uncalibrated"] is False for r in calibrated.to_pylist())
    assert not hps_uncalibrated(calibrated) and hps_uncalibrated(demo)
    assert not any("UNCALIBRATED" in n for n in pixel_metrics_notes(calibrated))
    assert any("UNCALIBRATED" in n for n in pixel_metrics_notes(demo))
    # A row written before the column existed (null) from TINY RANDOM networks may be the demo's: marked.
    legacy = demo.set_column(demo.schema.get_field_index("hps_uncalibrated"), "hps_uncalibrated",
                             pa.nulls(demo.num_rows, pa.bool_()))
    assert hps_uncalibrated(legacy)
    # The same study's page with the calibrated scorer's metrics: the column, unmarked.
    ctx = study_page_context(STUDY, {**tables, "study_pixel_metrics": calibrated}, STUDY, "q?", {}, [], "none")
    page = _env().get_template("study.html").render(title="t", meta={}, generated_at=None, csp=CSP, root="../", **ctx)
    assert _header(page) == "HPSv3 mu" and "UNCALIBRATED" not in page
