"""specviz imports downward only: every import, at module level or inside a function, goes to a lower layer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Lowest first, as the README's code map draws them. "shared" is specviz/'s own modules (settings, presets,
# host); "pages" also holds app.py. A folder may import its own modules and any layer before it.
LAYERS = ("core", "lessons", "shared", "models", "serve", "train", "bench", "labs", "viz", "app", "cli", "pages")


def _layer_of_file(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    if rel[0] != "specviz":
        return "pages"  # pages/*.py and app.py
    if rel == ("specviz", "__main__.py"):
        return "cli"  # `python -m specviz` is the command line's entry
    return rel[1] if len(rel) > 2 else "shared"


def _layer_of_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "specviz" or len(parts) == 1:
        return None  # another package, or `import specviz` itself (its __init__ imports nothing of ours)
    if (ROOT / "specviz" / parts[1]).is_dir():
        return parts[1]
    return "shared" if parts[1] != "__main__" else "cli"


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """Every specviz module an import names (for `from specviz import x`, the submodule x when it is one)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "specviz":
                out += [(node.lineno, f"specviz.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


def _sources() -> list[Path]:
    return [*sorted((ROOT / "specviz").rglob("*.py")), *sorted((ROOT / "pages").glob("*.py")), ROOT / "app.py"]


def test_every_import_goes_to_a_lower_layer():
    upward = []
    for path in _sources():
        here = _layer_of_file(path)
        for line, module in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            there = _layer_of_module(module)
            if there is not None and there != here and LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {module} ({there})")
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_the_layers_name_every_folder():
    folders = {p.name for p in (ROOT / "specviz").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(LAYERS), f"folders missing from LAYERS: {sorted(folders - set(LAYERS))}"


def test_an_upward_import_is_caught(tmp_path):
    """The check itself can fail: a core module that reached up to the labs would be named."""
    tree = ast.parse("def f():\n    from specviz.labs import how_far\n")
    (line, module), = _imports(tree)
    assert LAYERS.index(_layer_of_module(module)) > LAYERS.index("core") and line == 2
