"""Every shell block the docs show is run, so the docs cannot drift from the product.

A fenced block whose language is ``bash``, ``sh``, ``shell`` or ``console`` in README.md,
CONTRIBUTING.md or a page under docs/ is a command a reader types. The blocks of one page run in
order, as one bash script with ``set -euo pipefail``, in a scratch folder that has the repository's
``traces/``, ``configs/`` and ``deploy/``, with this checkout's ``replayer`` first on PATH: a page
reads as one session at a terminal. Processes a page starts in the background are stopped when it
ends. Where the host allows it the page runs in a network namespace of its own (``unshare``), so
the ports it shows (8000, 9090, 9400) are free whatever else runs.

A block that cannot run here (against your own server, on Kubernetes, the test suite itself) has
``<!-- skip: REASON -->`` on the line above it; the reason is required. A number the prose
states about what the commands print is checked: ``<!-- expect: REGEX -->`` beside it, searched
in the page's output. A page whose commands
need programs besides replayer says so once, ``<!-- needs: prometheus, jq -->``: where one is
missing the page is skipped with a reason, as the other tests that need them are (``.ci/run``
installs them).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELLS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+|~~~+)\s*(?P<info>[^\n]*)$")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")
NEEDS = re.compile(r"<!--\s*needs:\s*(?P<programs>.*?)\s*-->")
#: a number (or line) the page's prose states, checked in what its commands print:
#: ``<!-- expect: REGEX -->`` (Python regex, searched in the page's output, multi-line)
EXPECT = re.compile(r"<!--\s*expect:\s*(?P<regex>.*?)\s*-->")
#: the most a page may take (its blocks together) on a busy host
PAGE_TIMEOUT_S = 420


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    code: str
    skip: str | None  # the reason, or None: the block runs


def blocks_of(text: str, page: str) -> list[Block]:
    """The shell blocks of a Markdown page, in order."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, indent = m["fence"], m["info"].strip(), len(m["indent"])
        lang = info.split()[0].lstrip("{.").rstrip("}") if info else ""
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
            j += 1
        if lang in SHELLS:
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            skip = SKIP.match(prev)
            code = "\n".join(x[indent:] for x in lines[i + 1 : j])
            out.append(Block(page, i + 1, code, skip["reason"] if skip else None))
        i = j + 1
    return out


def needs_of(text: str) -> list[str]:
    """The programs a page's commands need besides replayer (``<!-- needs: a, b -->``)."""
    return [p for m in NEEDS.finditer(text) for p in re.split(r"[,\s]+", m["programs"]) if p]


def pages() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *docs] if p.exists()]


def _shell_blocks() -> list[tuple[str, list[Block]]]:
    found = []
    for p in pages():
        bs = blocks_of(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
        if bs:
            found.append((str(p.relative_to(ROOT)), bs))
    return found


PAGES = _shell_blocks()


def test_the_block_finder():
    text = (
        "intro\n```bash\nreplayer version\n```\n\n<!-- skip: your server -->\n```bash\ncurl x\n```\n```text\nout\n```\n"
    )
    a, b = blocks_of(text, "p.md")
    assert (a.code, a.skip, a.line) == ("replayer version", None, 2)
    assert (b.code, b.skip) == ("curl x", "your server")
    nested = "- step\n\n    ```bash\n    echo hi\n    ```\n"
    assert [x.code for x in blocks_of(nested, "p.md")] == ["echo hi"]
    assert needs_of("# T\n<!-- needs: prometheus, promtool jq -->\ntext") == ["prometheus", "promtool", "jq"]
    assert needs_of("no comment") == []


def test_every_skip_says_why():
    for _, bs in PAGES:
        for b in bs:
            assert b.skip is None or b.skip.strip(), f"{b.page}:{b.line}: a skip needs its reason"


def _netns_prefix() -> list[str]:
    """``unshare`` into a fresh network namespace with loopback up, where the host allows it."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return []
    probe = ["unshare", "--net", "--map-root-user", "sh", "-c", "ip link set lo up"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return []
    return ["unshare", "--net", "--map-root-user"]


def _scratch(tmp: Path) -> Path:
    for name in ("traces", "configs", "deploy"):
        (tmp / name).symlink_to(ROOT / name)
    return tmp


PREAMBLE = """\
set -euo pipefail
ip link set lo up 2>/dev/null || true
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
"""


@pytest.mark.parametrize("page", [p for p, bs in PAGES if any(b.skip is None for b in bs)])
def test_the_page_runs(page, tmp_path):
    missing = [p for p in needs_of((ROOT / page).read_text(encoding="utf-8")) if shutil.which(p) is None]
    if missing:
        pytest.skip(f"{page} needs {', '.join(missing)} (apt-get install them; .ci/run does)")
    bs = dict(PAGES)[page]
    script = PREAMBLE + "".join(f"\necho '>>> {b.page}:{b.line}'\n{b.code}\n" for b in bs if b.skip is None)
    (tmp_path / "page.sh").write_text(script)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["REPLAYER_REPO"] = str(ROOT)
    env.pop("REPLAYER_API_KEY", None)
    (tmp_path / "work").mkdir()
    work = _scratch(tmp_path / "work")
    cmd = [*_netns_prefix(), "bash", str(tmp_path / "page.sh")]
    proc = subprocess.Popen(
        cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{page}: its commands ran past {PAGE_TIMEOUT_S} s\n{out[-6000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    failed = out.rsplit(">>> ", 1)[-1].split("\n", 1)[0] if ">>> " in out else page
    assert proc.returncode == 0, f"the block at {failed} failed (exit {proc.returncode})\n{out[-8000:]}"
    text = (ROOT / page).read_text(encoding="utf-8")
    unmet = [m["regex"] for m in EXPECT.finditer(text) if not re.search(m["regex"], out, re.M)]
    assert unmet == [], f"{page}: what its prose states is not what its commands printed: {unmet}\n{out[-8000:]}"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "traces/README.md", "deploy/README.md"])
def test_the_links_outside_the_site_resolve(name):
    """The site's own links are checked by ``mkdocs build --strict``; these pages are read on the
    forge, so their relative links must name files of the repository (and, but for the
    contributors' guide, no ``../shared``)."""
    page = ROOT / name
    if not page.exists():
        pytest.skip(f"{name} does not exist")
    text = page.read_text(encoding="utf-8")
    if name != "CONTRIBUTING.md":  # (contributors have the shared folder: benchmarks, real vLLM)
        assert "../shared" not in text, name
    broken = []
    for m in LINK.finditer(text):
        target = m["target"].split("#", 1)[0]
        if not target or "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            broken.append(target)
    assert broken == [], f"{name}: links to missing files: {broken}"


def test_no_user_page_needs_the_shared_folder():
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        assert "../shared" not in p.read_text(encoding="utf-8"), p.relative_to(ROOT)
