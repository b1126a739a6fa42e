"""The report page drawn by headless Chromium: no console errors, every figure on screen."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import unavailable
from test_report_samples import make_confirm, make_profile, make_suggestions, make_tune

from autotune.report import ReportInputs, build_report, write_report

CHROMIUM = shutil.which("chromium")


@pytest.fixture(autouse=True)
def _chromium_here() -> None:
    """Chromium must be here (a failure under CI=true, where .ci/run installs it)."""
    if CHROMIUM is None:
        unavailable("chromium is not installed (apt-get install chromium; .ci/run does)")


# Console messages Chromium logs with --enable-logging=stderr --v=0, and failed loads.
_CONSOLE = re.compile(r"CONSOLE\(\d+\)|Uncaught|net::ERR_|Failed to load resource")


def _chromium(page: Path, tmp_path: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on a local file with networking and background services off."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--enable-logging=stderr",
        "--v=0",
    ]
    command = [str(CHROMIUM), *flags, *mode, page.resolve().as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)


def console_errors(stderr: str) -> list[str]:
    """The console messages and failed loads in Chromium's log."""
    return [line for line in stderr.splitlines() if _CONSOLE.search(line)]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A full report (profile, suggestions, confirm, trials, recommendation) on disk."""
    folder = tmp_path_factory.mktemp("report")
    suggestions = make_suggestions()
    inputs = ReportInputs(
        profile=make_profile(),
        suggestions=suggestions,
        confirm=make_confirm(suggestions),
        tune=make_tune(),
    )
    record = write_report(build_report(inputs), folder / "report.html")
    return folder / "report.html", record.figures


def test_page_draws_without_console_errors(page: tuple[Path, list[str]], tmp_path: Path) -> None:
    path, figures = page
    done = _chromium(path, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert console_errors(done.stderr) == []
    dom = done.stdout
    assert "autotune report" in dom
    for name in figures:
        assert re.search(rf'<figure id="fig-{name}"><img [^>]*src="data:image/png;base64,', dom)
    assert dom.count("<img ") == len(figures)


def test_screenshot_shows_the_figures(page: tuple[Path, list[str]], tmp_path: Path) -> None:
    from matplotlib.image import imread

    path, _ = page
    shot = tmp_path / "shot.png"
    done = _chromium(path, tmp_path, "--window-size=1200,2400", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    assert console_errors(done.stderr) == []
    pixels = imread(str(shot))[..., :3]
    # The figures' category colours: activations red and parameters blue must be on screen.
    for rgb in ((0xC4, 0x4E, 0x52), (0x4C, 0x72, 0xB0)):
        target = [channel / 255 for channel in rgb]
        close = (abs(pixels - target) < 0.02).all(axis=-1)
        assert close.sum() > 2000, f"colour {rgb} covers only {close.sum()} pixels"


def test_console_check_catches_a_script_error(tmp_path: Path) -> None:
    """The check above can fail: a page that throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><p>x</p><script>throw new Error('boom')</script></body></html>"
    )
    done = _chromium(bad, tmp_path, "--dump-dom")
    assert any("boom" in line for line in console_errors(done.stderr))
