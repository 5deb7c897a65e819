"""The layers drawn in docs/DESIGN.md ("Layers"), enforced: every module's imports are read with ast
(the top of the file, inside functions, under TYPE_CHECKING) and an arrow may only point to the
module's own layer or one below it; no two modules import each other, directly or round a circle;
no project import hides inside a function (third-party ones may: they keep start-up light); the
library never imports gradio; and the product (model/, app/, app.py, scripts/) never imports or runs
the lab (lab/: benchmarks, probes, studies, one-off measurements), which may use the product."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support import ROOT

# Bottom first. A module may import from its own layer and the layers below it, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("model", "model.common")),
    ("method", ("model.skipdecode",)),
    ("low-bit engine", ("model.lowbit",)),
    ("runtime", ("model.loading", "model.generation", "model.race")),
    ("training", ("model.training",)),
    ("evaluation", ("model.evaluation",)),
    ("tasks", ("model.tasks",)),
    ("studies", ("model.studies",)),
    ("commands", ("model.cli", "model.__main__")),
    # app/ one floor up, the same idea: what keeps the server fair and safe, the one settings schema
    # and the models a page picks, what the page shows, and the thin top that wires them.
    ("app serving", ("app.serving",)),
    ("app settings", ("app.settings", "app.tasks")),
    ("app page", ("app.page",)),
    ("app", ("app", "__app_script__")),
]
FORBIDDEN_IN_LIBRARY = ("gradio", "gradio_client")
# Layers that sit one above the other but must not meet: the page renders and never admits, queues
# or guards; serving sits below it only because the settings schema reads the job cost.
KEPT_APART = [("app.page", "app.serving")]


def _module_name(path: Path) -> str:
    if path == ROOT / "app.py":
        return "__app_script__"
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [*sorted((ROOT / "model").rglob("*.py")), *sorted((ROOT / "app").rglob("*.py")), ROOT / "app.py"]
    return {_module_name(path): path for path in files}


MODULES = _sources()


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS here and to docs/DESIGN.md"
    return best[0]


def _target(name: str) -> str | None:
    """The project module an imported name refers to (a submodule where it is one), or None."""
    if name in MODULES:
        return name
    parent = name.rpartition(".")[0]
    return parent if parent in MODULES else None


def imports_of(module: str) -> list[tuple[str, int, bool]]:
    """(imported name, line, inside a function) for every import statement of ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against this module's package
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                found.extend((f"{base}.{alias.name}", child.lineno, in_function) for alias in child.names)
                found.append((base, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def project_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {module: set() for module in MODULES}
    for module in MODULES:
        for name, _, _ in imports_of(module):
            target = _target(name)
            if target is not None and target != module:
                edges[module].add(target)
    return edges


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_arrow_points_up():
    upward = []
    for module, targets in project_edges().items():
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports against the layers (docs/DESIGN.md):\n" + "\n".join(upward)


def test_no_import_circle():
    edges = project_edges()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target):], target])
            elif target not in state:
                walk(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            walk(module, [module])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_no_project_import_hides_inside_a_function():
    hidden = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {name}"
              for module in MODULES for name, line, in_function in imports_of(module)
              if in_function and _target(name) is not None]
    assert not hidden, "project imports inside functions (move them to the top):\n" + "\n".join(sorted(set(hidden)))


def test_the_library_never_imports_gradio():
    offending = [f"{module}: {name}" for module in MODULES if not LAYERS[layer_of(module)][0].startswith("app")
                 for name, _, _ in imports_of(module) if name.split(".")[0] in FORBIDDEN_IN_LIBRARY]
    assert not offending, offending


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_page_and_serving_import_nothing_of_each_other():
    crossing = [f"{module} imports {target}" for module, targets in project_edges().items() for target in sorted(targets)
                for first, second in KEPT_APART
                if (_inside(module, first) and _inside(target, second)) or (_inside(module, second) and _inside(target, first))]
    assert not crossing, "the page and serving meet (tests/project/test_layers.py, KEPT_APART):\n" + "\n".join(crossing)


def test_the_checker_sees_what_it_must():
    """The checks themselves: a function-level import and a relative one are both read."""
    assert layer_of("model.skipdecode.decoder") < layer_of("model.lowbit.quantization") < layer_of("model.loading")
    assert "model.skipdecode.schedule" in project_edges()["model.skipdecode.decoder"]
    assert "model.common.paths" in project_edges()["model.lowbit.native_kernels"]
    assert layer_of("app.serving.fair_queue") < layer_of("app.settings") < layer_of("app.page.views") < layer_of("app.ui")
    assert "app.serving.gradio_internals" in project_edges()["app.serving.fair_queue"]  # `from app.serving import gi`


# --- the product and the lab ----------------------------------------------------------------------
# The lab (lab/) may import the product and run its scripts; the product never reaches into the lab: no
# import of `lab` or of a lab file by its name (a scripts/ file could put a lab folder on sys.path), no
# path into lab/ as a string of its own, no product shell script running a lab file.
LAB = ROOT / "lab"
LAB_PATH = re.compile(r"^lab(/[\w.-]+)*/?$")


def product_files(root: Path) -> list[Path]:
    return [*sorted((root / "model").rglob("*.py")), *sorted((root / "app").rglob("*.py")), root / "app.py",
            *sorted((root / "scripts").glob("*.py")), *sorted((root / "scripts").glob("*.sh"))]


def lab_names(lab: Path) -> set[str]:
    """`lab` and the name of every lab file, the names a product import could reach the lab by."""
    return {"lab"} | {path.stem for path in lab.rglob("*.py") if path.stem != "__init__"}


def _python_reaches(path: Path, names: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] in names]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in names:
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and LAB_PATH.match(node.value):
            found.append((node.lineno, f"the path {node.value!r}"))
    return sorted(found)


def _shell_reaches(path: Path) -> list[tuple[int, str]]:
    code = (line.split(" #")[0] for line in path.read_text().splitlines())  # comments may name the lab
    return [(number, line.strip()) for number, line in enumerate(code, 1)
            if not line.lstrip().startswith("#") and re.search(r"(^|[\s\"'=/])lab/", line)]


def lab_reaches(root: Path) -> list[str]:
    """Every place a product file imports, names the path of, or runs something of the lab."""
    names = lab_names(root / "lab")
    return [f"{path.relative_to(root)}:{line}: {what}" for path in product_files(root) if path.exists()
            for line, what in (_shell_reaches(path) if path.suffix == ".sh" else _python_reaches(path, names))]


def test_the_product_never_imports_the_lab():
    assert len(lab_names(LAB)) > 10 and len(product_files(ROOT)) > 100  # the walks found both sides
    reaching = lab_reaches(ROOT)
    assert not reaching, "the product reaches into the lab (lab/ may import the product, not the reverse):\n" + \
        "\n".join(reaching)


def test_the_lab_checker_sees_each_way_in(tmp_path: Path):
    """The check itself: an import of the package, of a lab file by name, a path into lab/ and a shell
    line running a lab file are each found; the lab named in a docstring or a comment is not."""
    (tmp_path / "lab" / "bench").mkdir(parents=True)
    (tmp_path / "lab" / "bench" / "native_ab.py").write_text("")
    (tmp_path / "model").mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "model" / "ok.py").write_text('"""Measured by lab/bench/native_ab.py."""\nimport model.common\n')
    (tmp_path / "model" / "bad.py").write_text("def f():\n    from lab.bench import native_ab\n")
    (tmp_path / "app.py").write_text('import sys\nsys.path.insert(0, "lab/bench")\nimport native_ab\n')
    (tmp_path / "scripts" / "run.sh").write_text("# lab/bench/native_ab.py: the lab's\npython lab/bench/native_ab.py\n")
    assert lab_reaches(tmp_path) == ["model/bad.py:2: from lab.bench import ...",
                                     "app.py:2: the path 'lab/bench'", "app.py:3: import native_ab",
                                     "scripts/run.sh:2: python lab/bench/native_ab.py"]
