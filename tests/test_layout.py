"""The package's shape: the layers of docs/design.md as folders, each importing only the layers below it; no import
circle; the core free of engine imports; modules of a readable size; config without torch; no file outside the package
cited.

Layers, lowest first: the core (the package's top-level modules, `policies/` and `pricing/`), `request_path/`
(engine-free), `analysis/` (offline tools), `integration/` (vLLM, the rollout drivers, OpenRLHF), `miniature/` (the
experiments on CPU). Entry points (`__main__`, the `grid` and `report` commands, `cli/`, `rewards/`) may import any
layer."""

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specrl_openrlhf"
ENGINE_PACKAGES = ("vllm", "ray", "openrlhf")
MAX_LINES = 500
MAX_TOP_LEVEL_MODULES = 14  # besides __init__ and __main__
MAX_PROPOSER_LINES = 250
ENTRY_POINTS = ("specrl_openrlhf.__main__", "specrl_openrlhf.grid", "specrl_openrlhf.report", "specrl_openrlhf.cli")
# what each layer must not import (the layers above it)
FORBIDDEN = {
    "core": ("request_path", "analysis", "integration", "miniature"),
    "request_path": ("analysis", "integration", "miniature"),
    "analysis": ("integration", "miniature"),
    "integration": ("miniature",),
    "miniature": (),
}


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


def layer_of(name: str) -> str | None:
    """The layer of a module of the package (None for entry points)."""
    if name == "specrl_openrlhf" or name.startswith(ENTRY_POINTS) or name.startswith("specrl_openrlhf.rewards"):
        return None
    part = name.split(".")[1]
    return part if part in FORBIDDEN else "core"


def test_each_layer_imports_only_the_layers_below_it():
    for name, path in modules().items():
        layer = layer_of(name)
        if layer is None:
            continue
        ours = {m for m in module_imports(name, path) if m.startswith("specrl_openrlhf.")}
        above = {m for m in ours if layer_of(m) in FORBIDDEN[layer]}
        assert not above, f"{name} ({layer}) imports {sorted(above)}, a layer above it (docs/design.md, Layers)"


def test_engine_free_layers_import_no_engine():
    for name, path in modules().items():
        if layer_of(name) not in ("core", "request_path", "analysis"):
            continue
        engines = {m for m in module_imports(name, path) if m.split(".")[0] in ENGINE_PACKAGES}  # typing too
        assert not engines, f"{name} imports {sorted(engines)}: move that code to integration/"


def test_the_folders_show_the_layers():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"
    assert not (PACKAGE / "integration" / "miniature").exists() and (PACKAGE / "miniature").is_dir()
    for folder in ("request_path", "analysis", "integration/vllm", "integration/rollout", "integration/openrlhf"):
        assert (PACKAGE / folder / "__init__.py").exists(), folder
    for stem in ("proposer", "histories", "engine_args", "rows"):  # the engine's proposer, split by job
        lines = (PACKAGE / "integration" / "vllm" / f"{stem}.py").read_text().count("\n")
        assert lines <= MAX_PROPOSER_LINES, f"integration/vllm/{stem}.py: {lines} lines"


def test_tests_mirror_the_modules():
    tests = PACKAGE.parent / "tests"
    for module in (
        "integration/rollout/engine_path",
        "integration/rollout/request_path",
        "integration/rollout/driver",
        "integration/vllm/edge",
        "integration/vllm/proposer",
        "request_path/planner",
        "pricing/curves",
        "pricing/steps",
        "pricing/projection",
        "pricing/rules",
        "pricing/measured",
        "history",
        "budget/acceptance",
        "budget/allocation",
        "pricing/online",
        "pricing/rl_scale",
    ):
        folder, _, stem = module.rpartition("/")
        assert (tests / folder / f"test_{stem}.py").exists(), f"no tests/{folder}/test_{stem}.py"


def test_no_module_is_over_500_lines_unless_it_says_why():
    for name, path in modules().items():
        text = path.read_text()
        lines = text.count("\n")
        docstring = ast.get_docstring(ast.parse(text)) or ""
        assert lines <= MAX_LINES or f"over {MAX_LINES} lines" in docstring, f"{name}: {lines} lines"


def test_the_package_cites_no_file_outside_it_and_no_module_gone():
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.parent.glob("docs/*.md"), PACKAGE.parent / "README.md"]:
        text = path.read_text()
        assert not re.search(r"\.\./shared|FACTS\.md", text), f"{path} cites a file users don't have"
        assert "specrl_openrlhf.tree" not in text, f"{path} cites specrl_openrlhf.tree, which is gone"


def test_the_config_loads_without_torch():
    code = (
        "import sys, specrl_openrlhf.config as c; c.ReuseConfig(policy='spec', lenience=1.5); "
        "assert 'torch' not in sys.modules, 'torch'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
