"""docs/architecture.md's package map names every module of the package (it named about 12 of 50)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_map_names_every_module():
    readme = (ROOT / "docs" / "architecture.md").read_text()
    start = readme.index("## Layout")
    end = readme.find("\n## ", start + 1)
    layout = readme[start : end if end >= 0 else None]
    pkg = ROOT / "replayer"
    modules = sorted(str(p.relative_to(pkg).with_suffix("")) for p in pkg.rglob("*.py"))
    assert len(modules) > 40
    assert [m for m in modules if f"`{m}`" not in layout] == []
    named = set(re.findall(r"`((?:trace|sim)/\w+)`", layout))
    gone = sorted(named - set(modules))
    assert gone == []  # no module named that is not there any more
