"""README's Layout section names every module of the package (it named about 12 of 50)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_layout_names_every_module():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Layout")
    layout = readme[start:readme.index("\n## ", start + 1)]
    pkg = ROOT / "replayer"
    modules = sorted(str(p.relative_to(pkg).with_suffix("")) for p in pkg.rglob("*.py"))
    assert len(modules) > 40
    assert [m for m in modules if f"`{m}`" not in layout] == []
    named = {cell.strip("`") for cell in layout.split() if cell.startswith("`") and cell.rstrip(",").endswith("`")}
    gone = sorted(n for n in named if "/" in n and n.split("/")[0] in ("trace", "sim") and n not in modules)
    assert gone == []  # no module named that is not there any more
