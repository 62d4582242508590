"""The report page in a real headless Chromium: every figure loads from disk, no console errors.

CI installs it with ``apt-get install -y chromium``; without it the test is skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from reportkit import write_golden

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
FIGURES = 7  # the golden records hold what every figure needs

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvbench.reports.html import write_report

    return write_report(write_golden(tmp_path_factory.mktemp("browser") / "results"))


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_every_image_loads_without_console_errors(page: Path, tmp_path: Path) -> None:
    done = chromium(tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[:500]
    assert 'data-images-loaded="true"' in body.group(0), body.group(0)
    assert f'data-image-count="{FIGURES}"' in body.group(0), body.group(0)
    assert len(re.findall(r"<img ", dom)) == FIGURES
    assert console_messages(done.stderr) == []


def test_screenshot_shows_the_page(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    done = chromium(
        tmp_path / "profile",
        f"--screenshot={shot}",
        "--window-size=1280,4000",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
        page.as_uri(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    assert console_messages(done.stderr) == []
