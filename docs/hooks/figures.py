"""MkDocs hook: the docs' figures are screenshots of a real run, taken at build time.

``img/report.png`` is ``replayer report`` of a short replay against the embedded simulator and
``img/sweep.png`` the page ``replayer sweep`` writes (of a synthetic trace of short requests),
both drawn by headless Chromium; so the
pictures show what this version of replayer produces, not what an older one did. They are made
once per build into a scratch folder (``REPLAYER_DOCS_FIGURES`` names a folder to keep and reuse
them, e.g. while ``mkdocs serve`` rebuilds) and added to the site as generated files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "mooncake_conversation_10min.parquet"
RUN = [sys.executable, "-m", "replayer"]
QUIET = ["--quiet", "--admin-port", "0"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        raise SystemExit("docs figures: headless Chromium is needed (apt-get install chromium; .ci/run installs it)")
    return found


def _shot(html: Path, png: Path, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            f"--window-size=1280,{height}",
            f"--screenshot={png}",
            f"file://{html}",
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    if not png.exists() or png.stat().st_size < 10_000:
        raise SystemExit(f"docs figures: chromium drew no picture of {html}")


def _make(out: Path) -> None:
    run_dir, sweep_dir = out / "run", out / "sweep"
    replay = [*RUN, "run", str(TRACE), "--speedup", "20", "--max-requests", "300", "--results", str(run_dir)]
    subprocess.run([*replay, *QUIET], check=True, capture_output=True, timeout=300)
    subprocess.run([*RUN, "report", str(run_dir)], check=True, capture_output=True, timeout=120)
    # the sweep: short requests (~0.2 s on the simulator), so that every point's offered span (12, 4
    # and 1.3 s) holds a steady window longer than its requests' E2E (docs/sweep.md) in ~40 s
    short = out / "short.parquet"
    synth = ["--rows", "240", "--rate", "20", "--input-dist", "const:256", "--output-dist", "const:16"]
    subprocess.run(
        [*RUN, "trace", "synth", "-o", str(short), *synth, "--block-size", "16"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    sweep = [*RUN, "sweep", str(short), "--speedups", "1,3,9", "--results", str(sweep_dir)]
    sweep += ["--goodput", "ttft:500", "e2el:5000"]
    done = subprocess.run([*sweep, *QUIET], capture_output=True, timeout=600)
    if done.returncode not in (0, 1):  # (1: a point did not hold, which the picture shows)
        raise SystemExit(f"docs figures: the sweep failed: {done.stderr.decode()[-2000:]}")
    (out / "img").mkdir(exist_ok=True)
    _shot(run_dir / "report.html", out / "img" / "report.png", 1800)
    _shot(sweep_dir / "sweep.html", out / "img" / "sweep.png", 1400)


def on_files(files, config):
    keep = os.environ.get("REPLAYER_DOCS_FIGURES")
    out = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="replayer-docs-figures-"))
    out.mkdir(parents=True, exist_ok=True)
    if not ((out / "img" / "report.png").exists() and (out / "img" / "sweep.png").exists()):
        _make(out)
    for name in ("report.png", "sweep.png"):
        files.append(File.generated(config, f"img/{name}", abs_src_path=str(out / "img" / name)))
    return files
