"""The package's shape: no import circle, the core free of engine imports, modules of a readable size, config without
torch, and no file outside the package cited."""

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specrl_openrlhf"
ENGINE_PACKAGES = ("vllm", "ray", "openrlhf")
MAX_LINES = 500


def modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in PACKAGE.rglob("*.py")
    }


def module_imports(name: str, path: Path) -> set[str]:
    """The modules `name` imports at module level (those for type checking included: a circle there is one too)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in tree.body:
        for child in (
            ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ()
        ):
            if isinstance(child, ast.Import):
                found |= {alias.name for alias in child.names}
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                found.add(base)
                found |= {f"{base}.{alias.name}" for alias in child.names}
    return found


def test_no_import_circle_among_the_packages_modules():
    known = modules()
    graph = {name: {m for m in module_imports(name, path) if m in known and m != name} for name, path in known.items()}
    for name in graph:  # a package's __init__ is imported with each of its modules: not an edge of its own
        graph[name] -= {p for p in graph[name] if name.startswith(p + ".")}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(trail[trail.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_core_imports_no_engine():
    for name, path in modules().items():
        if ".integration" in name:
            continue
        engines = {m for m in module_imports(name, path) if m.split(".")[0] in ENGINE_PACKAGES}  # typing too
        assert not engines, f"{name} (core) imports {sorted(engines)}: move that code to integration/"


def test_no_module_is_over_500_lines_unless_it_says_why():
    for name, path in modules().items():
        text = path.read_text()
        lines = text.count("\n")
        docstring = ast.get_docstring(ast.parse(text)) or ""
        assert lines <= MAX_LINES or f"over {MAX_LINES} lines" in docstring, f"{name}: {lines} lines"


def test_the_package_cites_no_file_outside_it():
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.parent.glob("docs/*.md"), PACKAGE.parent / "README.md"]:
        text = path.read_text()
        assert not re.search(r"\.\./shared|FACTS\.md", text), f"{path} cites a file users don't have"


def test_the_config_loads_without_torch():
    code = (
        "import sys, specrl_openrlhf.config as c; c.ReuseConfig(policy='spec', lenience=1.5); "
        "assert 'torch' not in sys.modules, 'torch'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
