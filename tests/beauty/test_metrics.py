"""tasks.beauty.metrics with TINY RANDOM networks of the real architectures, built in the test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from schemas.study import STUDY_PIXEL_METRICS
from tasks.beauty import metrics as M


def _image(path, mean, rng):
    Image.fromarray(np.clip(rng.normal(mean, 40, (48, 64, 3)), 0, 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tasks.hpsv3.scorer import HPSv3Scorer
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint

    root = tmp_path_factory.mktemp("pixel")
    write_tiny_base_model(root / "base")
    write_tiny_checkpoint(root / "base", root / "hps.safetensors", seed=0)
    hps = HPSv3Scorer.load(str(root / "base"), str(root / "hps.safetensors"), device="cpu", dtype="float32")
    networks = M.tiny_random_networks(root / "nets", seed=0, hps=hps)
    rng = np.random.default_rng(0)
    refs = [_image(root / f"ref{i}.png", 128, rng) for i in range(6)]
    # Planted: t0 looks like the reference, t1 is brighter, t2 much brighter.
    tools = {
        f"t{k}": [M.ToolImages(_image(root / f"t{k}-{i}.png", 128 + 60 * k, rng), f"A small miracle, take {i}") for i in range(4)]
        for k in range(3)
    }
    return networks, refs, tools


def test_pixel_metrics_rows_intervals_and_labels(setup):
    networks, refs, tools = setup
    table = M.pixel_metrics(tools, refs, networks, study_id="s1", resamples=60, seed=1)
    assert table.schema.equals(STUDY_PIXEL_METRICS)
    assert table.schema.metadata[b"note"].decode() == M.FID_NOTE
    rows = table.to_pylist()
    assert [r["tool"] for r in rows] == ["t0", "t1", "t2"]
    assert all(r["weights"] == "TINY RANDOM" and r["n_images"] == 4 and r["study_id"] == "s1" for r in rows)
    fids = [r["fid"] for r in rows]
    assert fids[0] < fids[1] < fids[2]  # the planted distance from the reference shows through
    for r in rows:
        assert r["fid_lo"] < r["fid_hi"] and r["fid_lo"] >= 0
        assert r["kid"] is not None and r["inception_score"] >= 1.0 - 1e-9 and 0.0 <= r["clip_score"] <= 100.0
    # HPSv3 mu is the mean mu of the tool's images from the scorer (uncalibrated: TINY RANDOM).
    t1 = tools["t1"]
    want = networks.hps.score([i.path for i in t1], [i.prompt for i in t1])[:, 0].mean()
    assert rows[1]["hps_mu"] == pytest.approx(want, rel=1e-6)
    notes = M.pixel_metrics_notes(table)
    assert "FID on a few images per tool is noisy" in notes[0] and "Images per tool here: 4." in notes[0]
    assert any("TINY RANDOM" in n for n in notes)
    # Same inputs and seed: the same table; no reference folder: FID and KID are null.
    assert table.equals(M.pixel_metrics(tools, refs, networks, study_id="s1", resamples=60, seed=1))
    no_ref = M.pixel_metrics({"t0": tools["t0"]}, None, networks, resamples=10).to_pylist()[0]
    assert no_ref["fid"] is None and no_ref["kid"] is None and no_ref["clip_score"] is not None


def test_fid_identity_matches_torchmetrics():
    from torchmetrics.image.fid import FrechetInceptionDistance

    rng = np.random.default_rng(3)
    real = rng.normal(0, 1, (12, 64))
    fake = rng.normal(0.4, 1.3, (9, 64))
    metric = FrechetInceptionDistance(feature=M._Features(64))
    metric.update(torch.from_numpy(real), real=True)
    metric.update(torch.from_numpy(fake), real=False)
    assert M.fid_from_features(real, fake) == pytest.approx(float(metric.compute()), rel=1e-6)
    assert M.fid_from_features(real, real) == pytest.approx(0.0, abs=1e-8)
    with pytest.raises(ValueError, match="at least 2 images on each side"):
        M.fid_from_features(real[:1], fake)


def test_networks_load_from_local_files_and_bad_files_are_named(setup, tmp_path):
    networks, _, _ = setup
    bad = tmp_path / "inception.pt"
    torch.save({"not": torch.zeros(1)}, bad)
    clip_dir = tmp_path / "clip"
    with pytest.raises(FileNotFoundError, match=f"CLIP model {clip_dir}"):
        M.load_networks(bad, clip_dir)
    with pytest.raises(FileNotFoundError, match="Inception weights .*missing.pt: no such file"):
        M.load_networks(tmp_path / "missing.pt", clip_dir)
    clip_dir.mkdir()
    (clip_dir / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=f"Inception weights {bad}: not a FID InceptionV3 state dict"):
        M.load_networks(bad, clip_dir)
    with pytest.raises(ValueError, match="tool t9: 1 image"):
        M.pixel_metrics({"t9": [M.ToolImages(bad, "x")]}, None, networks)


def test_a_real_study_without_weights_gets_no_pixel_metrics(tmp_path):
    from types import SimpleNamespace

    from schemas.study import JudgeSpec, StudyDefinition

    definition = StudyDefinition(study_id="s1", tools=["a", "b"], judges=[JudgeSpec(label="j1", group="photographers")])
    settings = SimpleNamespace(beauty_inception_weights=None, beauty_clip_model="/somewhere")
    table = M.study_pixel_metrics(settings, definition, tmp_path)
    assert table.num_rows == 0 and table.schema.equals(STUDY_PIXEL_METRICS)


def test_local_networks_print_no_download_style_bars(tmp_path, capfd):
    """Issue 15, item 10: `make demo` printed "Writing model shards ... it/s" and "Loading weights
    ... it/s" bars for the tiny CLIP it writes and reads back from a local folder. They are off
    while it does, and transformers' own setting is restored after."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    M.tiny_random_networks(tmp_path / "nets", seed=0)
    M.load_networks(tmp_path / "nets" / "inception.pt", tmp_path / "nets" / "clip")
    out, err = capfd.readouterr()
    assert "it/s" not in out + err and "Loading weights" not in out + err and "model shards" not in out + err, err
    assert hf_logging.is_progress_bar_enabled()
