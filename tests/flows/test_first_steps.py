"""A newcomer's first steps (issue 26 item 8): the README's commands run as written from any folder,
and the small things a first session meets say what they mean: the Beauty study opened outside the
checkout (the reference folder is the one shipped beside the code), the README's paths, the VAB
answers' `order`, `import-verdicts` of a missing file, `hpsv3 --pairs` with an image ingest
refuses, `vab audit`'s note on the built-in OCR judge, `--version`, shell completion, and `make`
saying what it installs. (`panel serve` and one Ctrl-C: tests/panel/test_ctrl_c.py.)"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.flows.conftest import REPO, image_bytes

README = (REPO / "README.md").read_text()
IMAGEBENCH = str(Path(sys.executable).parent / "imagebench")  # the installed entry point, as a user runs it


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without any IMAGEBENCH_* setting (the defaults, as after a fresh
    clone), the warm server off (no server left behind), wide lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEBENCH_", "PYTEST"))}
    env.pop("PYTHONPATH", None)  # the entry point finds the code as it is installed, not through pytest's path
    return {**env, "IMAGEBENCH_WARM": "off", "COLUMNS": "400", **extra}


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


# ---- the reference folder, from any working directory ---------------------------------------------


def test_the_default_reference_dir_is_the_one_beside_the_code_whatever_the_cwd(tmp_path, monkeypatch):
    """Unset, IMAGEBENCH_REFERENCE_DIR is the checkout's reference/ (found from the code, not the
    working directory); set, it is what the user wrote (relative: to the working directory)."""
    from schemas.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IMAGEBENCH_REFERENCE_DIR", raising=False)
    monkeypatch.delenv("IMAGEBENCH_CONFIG", raising=False)
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    settings = load_settings()
    assert settings.reference_dir == REPO / "reference"
    assert settings.suite_path.is_file()
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_DIR", "my-ref")
    assert load_settings().reference_dir == Path("my-ref")


def test_a_beauty_study_opens_outside_the_checkout_at_the_readmes_paths(tmp_path):
    """The README's `study init` then `study open`, typed in a folder that is not the checkout with
    nothing exported: `open` found no prompt suite (`reference/...` was read relative to the
    working directory) while `init` worked; the file the README says to edit and the links file it
    names are where the commands wrote them."""
    from tasks.beauty.suite import load_beauty_suite

    init_line = re.search(r"^imagebench (study init my-study [^#\n]*?)\s+# edit (\S+/study\.yaml)", README, re.M)
    links_path = re.search(r"writes them to (\S+/links\.csv)", README)
    assert init_line and links_path, "README: the study init line or the links file is gone"
    work = tmp_path / "lab"
    work.mkdir()
    env = _env()
    init = _run([IMAGEBENCH, *init_line.group(1).split()], work, env)
    assert init.returncode == 0, init.stdout + init.stderr
    assert (work / init_line.group(2)).is_file(), f"README says to edit {init_line.group(2)}; init said: {init.stderr}"
    # each tool's images where the README puts them (the embedded store: ./data/objects)
    tools = re.search(r"--tools (\S+)", init_line.group(1)).group(1).split(",")
    for i, tool in enumerate(tools):
        folder = work / "data" / "objects" / "beauty" / "beauty-index-v1" / tool
        folder.mkdir(parents=True)
        for j, prompt in enumerate(load_beauty_suite(REPO / "reference").prompts):
            (folder / f"{prompt.prompt_id}.png").write_bytes(image_bytes(100 * i + j))
    opened = _run([IMAGEBENCH, "study", "open", "my-study", "--url", "https://panel.example"], work, env)
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert "prompt suite file not found" not in opened.stderr
    assert (work / links_path.group(1)).is_file(), f"README names {links_path.group(1)}"


# ---- the README's VAB answers -------------------------------------------------------------------


def test_the_readme_says_what_a_vab_answers_order_is_and_its_example_imports_as_it_says():
    """The README listed `task_id,trial,order,best,worst` without saying what `order` holds. Its
    example row, read by the importer, names the images the README says it names."""
    from tasks.vab.imports import COLUMNS, parse_answers

    assert ",".join(COLUMNS) in README
    m = re.search(r"e\.g\. the row `([^`]+)` says the judge was shown images (\d), (\d), (\d) "
                  r"and picked image (\d) as best and image (\d) as worst", " ".join(README.split()))
    assert m, "README: no example of a VAB answers row"
    row = m.group(1)
    task_id = row.split(",")[0]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"readme-answers-{os.getpid()}.csv"
    try:
        path.write_text(",".join(COLUMNS) + "\n" + row + "\n")
        task = SimpleNamespace(images=["a.png", "b.png", "c.png"])
        [parsed] = parse_answers(path, {task_id: task}, "readme", "someone")
    finally:
        path.unlink(missing_ok=True)
    shown = [int(m.group(i)) for i in (2, 3, 4)]
    assert parsed["order"] == shown
    assert (parsed["best"], parsed["worst"]) == (int(m.group(5)), int(m.group(6)))


# ---- messages ---------------------------------------------------------------------------------------


def test_import_verdicts_of_a_missing_file_says_verdicts_file(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["import-verdicts", "nope.csv"], catch_exceptions=False)
    assert r.exit_code == 1
    flat = " ".join(r.output.split())
    assert "nope.csv: verdicts file not found" in flat and "scores" not in flat, flat
    r = CliRunner().invoke(app, ["import-scores", "nope.csv"], catch_exceptions=False)
    assert r.exit_code == 1 and "nope.csv: scores file not found" in " ".join(r.output.split())


def test_vab_audit_says_the_builtin_ocr_judge_cannot_rank_sets(tmp_path):
    """The routing's OCR judge is built in: the audit's note said it was "not in the endpoints
    config", as if the user had forgotten to configure it."""
    from schemas.settings import load_settings
    from tasks.vab.audit import own_judges

    settings = load_settings(home=tmp_path / "home", reference_dir=REPO / "reference", judges_config=None)
    names, notes = own_judges(settings)
    assert names == ["hpsv3"]
    [ocr] = [n for n in notes if "'ocr'" in n]
    assert "endpoints config" not in ocr and "built-in" in ocr and "cannot rank image sets" in ocr, ocr
    vlm = [n for n in notes if "'qwen3-vl'" in n]
    assert vlm and "not in the endpoints config" in vlm[0]  # a VLM judge the user can configure: said so


def test_hpsv3_pairs_refuses_an_image_ingest_refuses_naming_it(tmp_path, monkeypatch):
    """A 1x1 image was scored without a word (ingest quarantines it as too small). The pairs are
    checked with ingest's own function before any model loads: one line names the file, the line
    and ingest's reason; nothing is scored."""
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.store.ingest import Rejected, inspect_image

    from PIL import Image

    (tmp_path / "good.png").write_bytes(image_bytes(1))
    Image.new("RGB", (1, 1), (200, 10, 10)).save(tmp_path / "dot.png")
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", newline="") as fh:
        csv.writer(fh).writerows([["image", "prompt"], ["good.png", "a photo"], ["dot.png", "a red dot"]])
    with pytest.raises(Rejected) as ingest_says:
        inspect_image((tmp_path / "dot.png").read_bytes(), "dot.png")
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    # a checkpoint that does not exist: the refusal must come before any model is loaded
    r = CliRunner().invoke(app, ["hpsv3", "--pairs", str(pairs), "--checkpoint", str(tmp_path / "none.safetensors"),
                                 "--base-model", str(tmp_path / "none"), "--device", "cpu", "--format", "json"],
                           catch_exceptions=False)
    flat = " ".join(r.output.split())
    assert r.exit_code == 1, r.output
    assert "pairs.csv:3" in flat and ingest_says.value.detail in flat and "nothing scored" in flat, flat
    assert "none.safetensors" not in flat and '"mu"' not in flat


# ---- --version and completion --------------------------------------------------------------------


def test_version_prints_the_package_version_and_the_commit(tmp_path):
    from importlib.metadata import version

    r = _run([IMAGEBENCH, "--version"], tmp_path, _env())
    assert r.returncode == 0, r.stderr
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    assert r.stdout.startswith(f"imagebench {version('imagebench')} (commit {commit}"), r.stdout
    assert len(r.stdout.strip().splitlines()) == 1


def test_shell_completion_installs_and_completes(tmp_path):
    """`--install-completion` was "No such option". Installed for bash into a fresh HOME, the
    script it wrote asks `imagebench` itself, which completes sub-commands and options."""
    home = tmp_path / "home"
    home.mkdir()
    env = _env(HOME=str(home), SHELL="/bin/bash")
    assert "--install-completion" in _run([IMAGEBENCH, "--help"], tmp_path, env).stdout
    inst = _run([IMAGEBENCH, "--install-completion", "bash"], tmp_path, env)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    assert "imagebench" in (home / ".bashrc").read_text()
    # <TAB> in bash: the installed function, sourced from ~/.bashrc, asks `imagebench` (on PATH)
    env["PATH"] = f"{Path(IMAGEBENCH).parent}:{env.get('PATH', '/usr/bin:/bin')}"

    def tab(*words: str) -> list[str]:
        script = (f"source ~/.bashrc; COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
                  f"_imagebench_completion imagebench {words[-1]} {words[-2]}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        r = _run(["bash", "--norc", "-c", script], tmp_path, env)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout.split()

    assert tab("imagebench", "stu") == ["study"]
    assert "--url" in tab("imagebench", "study", "open", "--u")


# ---- make -------------------------------------------------------------------------------------


def test_make_says_what_it_installs_before_pip_runs():
    """`make demo` printed nothing for minutes while pip installed ~200 pinned packages quietly.
    The setup step announces each stage with how long it takes, before pip runs, and pip shows
    what it installs."""
    r = subprocess.run(["make", "-n", "-B", "demo"], cwd=REPO, capture_output=True, text=True, check=True,
                       env={**os.environ, "MAKEFLAGS": ""})
    lines = r.stdout.splitlines()
    pip_lock = next(i for i, line in enumerate(lines) if "pip install" in line and "requirements.lock" in line)
    said = [line for line in lines[:pip_lock] if line.startswith("echo ")]
    assert any("requirements.lock" in s and re.search(r"\d+ min", s) for s in said), lines[:pip_lock]
    assert "--quiet" not in lines[pip_lock] and " -q" not in lines[pip_lock], lines[pip_lock]
