"""The package's shape: the layers of docs/design.md as folders, each importing only the layers below it; no import
circle at any depth; the core free of engine imports; modules of a readable size; config without torch; no file
outside the package cited.

Every import counts: at module level, inside functions and methods, under `if TYPE_CHECKING`, and
`importlib.import_module` with a literal name. Layers, lowest first: the core (the package's top-level modules,
`policies/` and `pricing/`), `request_path/` (engine-free), `simulator/` (the engine simulator, engine-free),
`analysis/` (offline tools), `integration/` (vLLM, the rollout drivers, OpenRLHF), `miniature/` (the experiments on
CPU), `at_scale/` (`bench_at_scale.py`: the rules simulated and priced at RL scale). Entry points (`__main__`, the
`grid` and `report` commands, `cli/`, `rewards/`) may import any layer."""

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specrl_openrlhf"
ENGINE_PACKAGES = ("vllm", "ray", "openrlhf")
MAX_LINES = 400
MAX_FUNCTION_LINES = 100
MAX_TOP_LEVEL_MODULES = 14  # besides __init__ and __main__
MAX_PROPOSER_LINES = 250
ENTRY_POINTS = ("specrl_openrlhf.__main__", "specrl_openrlhf.grid", "specrl_openrlhf.report", "specrl_openrlhf.cli")
# what each layer must not import (the layers above it)
LAYERS = ("core", "request_path", "simulator", "analysis", "integration", "miniature", "at_scale")
FORBIDDEN = {layer: LAYERS[i + 1 :] for i, layer in enumerate(LAYERS)}


def modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in PACKAGE.rglob("*.py")
    }


def _absolute(package: str, module: str, level: int) -> str:
    """`module` imported `level` dots up from `package` (level 0: already absolute)."""
    if not level:
        return module
    parts = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(parts + ([module] if module else []))


def _literal_import_module(node: ast.Call, name: str, package: str) -> str | None:
    """The module of `importlib.import_module("...")` (or `import_module`) called with a literal, else None; a relative
    one resolved against its `package` argument (`__name__`, `__package__` or a literal)."""
    func = node.func
    named = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if named != "import_module" or not node.args:
        return None
    target = node.args[0]
    if not (isinstance(target, ast.Constant) and isinstance(target.value, str)):
        return None
    level = len(target.value) - len(target.value.lstrip("."))
    anchor = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "package"), None)
    if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
        package = anchor.value
    elif isinstance(anchor, ast.Name) and anchor.id == "__name__":
        package = name
    return _absolute(package, target.value[level:], level)


def lazy_exports() -> dict[str, str]:
    """The package's top-level names that load their module on first use (`_EXPORTS` in its __init__): an import
    of such a name, or `sr.Name` after `import specrl_openrlhf as sr`, imports that module."""
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return {name: f"{PACKAGE.name}.{module}" for name, module in ast.literal_eval(node.value).items()}
    return {}


def module_imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports: at module level, inside functions and methods, under `if TYPE_CHECKING` (a
    circle there is one too), relative or absolute, `importlib.import_module` with a literal name, and the modules
    behind the package's lazily loaded names."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    exports = lazy_exports()
    found, aliases = set(), set()  # aliases: local names bound to the package itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            aliases |= {alias.asname or alias.name for alias in node.names if alias.name == PACKAGE.name}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(package, node.module or "", node.level)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
            if base == PACKAGE.name:
                found |= {exports[alias.name] for alias in node.names if alias.name in exports}
        elif isinstance(node, ast.Call) and (target := _literal_import_module(node, name, package)):
            found.add(target)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.add(exports.get(node.attr, f"{PACKAGE.name}.{node.attr}"))
    return found


def import_graph() -> dict[str, set[str]]:
    """The package's modules and, for each, the modules of the package it imports (its own packages left out: a
    package's __init__ is imported with each of its modules, not an edge of its own)."""
    known = modules()
    graph = {name: {m for m in module_imports(name, path) if m in known and m != name} for name, path in known.items()}
    for name in graph:
        graph[name] -= {p for p in graph[name] if name.startswith(p + ".")}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's circles: its strongly connected components of two modules or more (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return sorted(circles)


def test_the_import_reader_sees_every_import(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "import specrl_openrlhf as sr\n"
        "from specrl_openrlhf import SpeculativePlanner\n"
        "if TYPE_CHECKING:\n"
        "    from .typed import T\n"
        "def f():\n"
        "    from ..up import down\n"
        "class C:\n"
        "    def m(self):\n"
        "        import specrl_openrlhf.inner\n"
        "        importlib.import_module('specrl_openrlhf.loaded')\n"
        "        return importlib.import_module('.rel', __package__)\n"
        "def g():\n"
        "    return sr.DraftCache\n"
    )
    found = module_imports("specrl_openrlhf.pkg.probe", source)
    for module in (
        "specrl_openrlhf.pkg.typed",
        "specrl_openrlhf.up.down",
        "specrl_openrlhf.inner",
        "specrl_openrlhf.loaded",
        "specrl_openrlhf.pkg.rel",
        "specrl_openrlhf.request_path.planner",  # a lazily loaded name
    ):
        assert module in found, module
    assert "specrl_openrlhf.cache" in found  # sr.DraftCache


def test_circles_are_found_at_any_depth():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_no_import_circle_among_the_packages_modules():
    circles = import_circles(import_graph())
    assert not circles, "import circles (docs/design.md, Layers): " + "; ".join(" <-> ".join(c) for c in circles)


def layer_of(name: str) -> str | None:
    """The layer of a module of the package (None for entry points)."""
    if name == "specrl_openrlhf" or name.startswith(ENTRY_POINTS) or name.startswith("specrl_openrlhf.rewards"):
        return None
    part = name.split(".")[1]
    return part if part in FORBIDDEN else "core"


def test_each_layer_imports_only_the_layers_below_it():
    up_arrows = []
    for name, path in sorted(modules().items()):
        layer = layer_of(name)
        if layer is None:
            continue
        ours = {m for m in module_imports(name, path) if m.startswith("specrl_openrlhf.")}
        above = {m for m in ours if layer_of(m) in FORBIDDEN[layer]}
        up_arrows += [f"{name} ({layer}) imports {sorted(above)}"] if above else []
    assert not up_arrows, "arrows back up a layer (docs/design.md, Layers): " + "; ".join(up_arrows)


def test_engine_free_layers_import_no_engine():
    for name, path in modules().items():
        if layer_of(name) not in ("core", "request_path", "simulator", "analysis"):
            continue
        engines = {m for m in module_imports(name, path) if m.split(".")[0] in ENGINE_PACKAGES}  # typing too
        assert not engines, f"{name} imports {sorted(engines)}: move that code to integration/"


def test_the_folders_show_the_layers():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}"
    assert not (PACKAGE / "integration" / "miniature").exists() and (PACKAGE / "miniature").is_dir()
    folders = (
        "request_path",
        "simulator",
        "analysis",
        "integration/vllm",
        "integration/rollout",
        "integration/openrlhf",
    )
    for folder in (*folders, "at_scale"):
        assert (PACKAGE / folder / "__init__.py").exists(), folder
    for stem in ("v1/proposer", "v1/board", "histories", "engine_args", "v1/rows"):  # the proposer, split by job
        lines = (PACKAGE / "integration" / "vllm" / f"{stem}.py").read_text().count("\n")
        assert lines <= MAX_PROPOSER_LINES, f"integration/vllm/{stem}.py: {lines} lines"


def test_tests_mirror_the_modules():
    tests = PACKAGE.parent / "tests"
    for module in (
        "integration/rollout/engine_path",
        "integration/rollout/request_path",
        "integration/rollout/driver",
        "integration/vllm/edge",
        "integration/vllm/v1/proposer",
        "integration/vllm/v1/board",
        "request_path/planner",
        "request_path/scoring",
        "request_path/chunking",
        "analysis/grid",
        "analysis/grid_file",
        "analysis/grid_run",
        "analysis/run_readers",
        "analysis/report_rows",
        "analysis/report",
        "pricing/curves",
        "pricing/steps",
        "pricing/projection",
        "pricing/interpolation",
        "pricing/rule_figures",
        "pricing/measured",
        "history",
        "budget/acceptance",
        "budget/allocation",
        "budget/proposer_report",
        "pricing/online",
        "pricing/rl_scale",
    ):
        folder, _, stem = module.rpartition("/")
        assert (tests / folder / f"test_{stem}.py").exists(), f"no tests/{folder}/test_{stem}.py"


def test_each_folder_that_lists_its_modules_names_every_one():
    """A folder's docstring that says what each of its modules is for names them all."""
    for folder in ("at_scale", "budget", "miniature", "pricing", "simulator", "integration/vllm/v1"):
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
        named = set(re.findall(r"`(\w+)`", doc))
        stems = {p.stem for p in (PACKAGE / folder).glob("*.py")} - {"__init__"}
        assert stems <= named, f"{folder}/__init__.py does not name {sorted(stems - named)}"


def test_no_module_is_over_400_lines():
    long = {name: lines for name, path in modules().items() if (lines := path.read_text().count("\n")) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines, split them by job: {dict(sorted(long.items()))}"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """The functions and methods of `source`, nested ones included, whose def spans more than `limit` lines (from
    `def` to its last line), by qualified name."""
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, prefix)
                continue
            name = prefix + child.name
            lines = child.end_lineno - child.lineno + 1
            if not isinstance(child, ast.ClassDef) and lines > limit:
                found[name] = lines
            visit(child, name + ".")

    visit(ast.parse(source), "")
    return found


def test_the_function_reader_finds_long_functions_at_any_depth():
    source = (
        "def short():\n"
        "    return 1\n"
        "class C:\n"
        "    def long(self):\n"
        "        a = 1\n"
        "        async def inner():\n"
        "            b = 2\n"
        "            c = 3\n"
        "            return b + c\n"
        "        return a\n"
        "if True:\n"
        "    def hidden():\n"
        "        d = 4\n"
        "        e = 5\n"
        "        return d + e\n"
    )
    assert long_functions(source, limit=3) == {"C.long": 7, "C.long.inner": 4, "hidden": 4}


def test_no_function_is_over_100_lines():
    long = {
        f"{name}.{function}": lines
        for name, path in modules().items()
        for function, lines in long_functions(path.read_text()).items()
    }
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines, split them by job: {dict(sorted(long.items()))}"


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
