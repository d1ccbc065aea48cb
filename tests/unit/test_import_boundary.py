"""Which way the three packages import, read from their source (no module is run).

- the daemon (``kvstore``) imports nothing of the client or the tools;
- the client imports nothing of the tools (``kvstore_tools``: the admin
  tool, the demo, the benchmarks and what only they use: tasks, workload
  generators, fidelity measures);
- the client (``engine_client``) reaches the daemon's package only through
  the contract both sides import, ``kvstore.contract`` (the wire, geometry,
  quantization and errors);
- no two files import each other, directly or around a loop, counting every
  ``import`` and ``from ... import``: relative ones, ones inside functions (a
  lazy import still runs) and ones under ``if TYPE_CHECKING:`` (they never
  run, but a type named across a loop is the same coupling: the two files
  still have to change together);
- a file of more than 400 lines says why in its module docstring;
- the store's parts (``kvstore/store/``) reach one another only through
  public names: no ``other._name``, only ``self._name``.

Each check is a function of a source tree, and ``test_each_check_catches_*``
runs it on a small tree that breaks it.
"""

import ast
import os
import subprocess
import sys

from helpers import data_root

PACKAGES = ("kvstore", "engine_client", "kvstore_tools")
CLIENT_MAY_IMPORT = ("kvstore.contract",)
MAX_LINES = 400
PARTS = ("kvstore/store/",)  # modules whose objects touch no other object's _private attributes
GENERATED = ("kvstore/contract/_proto/",)  # python -m kvstore_tools.gen_proto writes them; nobody reads them for their length
# A cycle here names the files and what would remove it; the test fails once it is gone, so the entry goes too.
KNOWN_CYCLES: dict[frozenset, str] = {}  # a cycle left in place for a stated reason, until it goes
CLIENT_MODULES = ("engine_client.client", "engine_client.runner", "engine_client.prefetch", "engine_client.pages")


def modules(root: str) -> dict[str, str]:
    """Dotted module name -> file, for every .py file of the packages under ``root``."""
    out = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    parts = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
                    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(module: str, path: str) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of everything a file imports, type hints' imports too: ``from a import b`` gives ``a.b``."""
    is_package = path.endswith("__init__.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return out


def resolve(name: str, known: dict[str, str]) -> str | None:
    """The longest known module ``name`` is or is inside (``kvstore.contract.pb`` -> ``kvstore.contract``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def import_graph(root: str) -> dict[str, dict[str, int]]:
    """Module -> {module of the three packages it imports: first line}."""
    known = modules(root)
    graph = {}
    for module, path in known.items():
        edges = {}
        for name, line in imported_names(module, path):
            target = resolve(name, known)
            if target is not None and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def daemon_imports_upward(root: str) -> list[str]:
    return [
        f"{m} line {line} imports {t}"
        for m, edges in sorted(import_graph(root).items())
        if m.split(".")[0] == "kvstore"
        for t, line in edges.items()
        if t.split(".")[0] in ("engine_client", "kvstore_tools")
    ]


def client_imports_the_tools(root: str) -> list[str]:
    return [
        f"{m} line {line} imports {t}"
        for m, edges in sorted(import_graph(root).items())
        if m.split(".")[0] == "engine_client"
        for t, line in edges.items()
        if t.split(".")[0] == "kvstore_tools"
    ]


def client_imports_beyond_the_wire(root: str) -> list[str]:
    def allowed(target: str) -> bool:
        return any(target == a or target.startswith(a + ".") for a in CLIENT_MAY_IMPORT)

    return [
        f"{m} line {line} imports {t}"
        for m, edges in sorted(import_graph(root).items())
        if m.split(".")[0] == "engine_client"
        for t, line in edges.items()
        if t.split(".")[0] == "kvstore" and not allowed(t)
    ]


def cycles(root: str) -> list[frozenset]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph = import_graph(root)
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def long_files_without_a_reason(root: str) -> list[str]:
    out = []
    for module, path in sorted(modules(root).items()):
        rel = os.path.relpath(path, root)
        if rel.startswith(GENERATED):
            continue
        with open(path) as f:
            text = f.read()
        lines = text.count("\n")
        if lines > MAX_LINES and "Why" not in (ast.get_docstring(ast.parse(text)) or ""):
            out.append(f"{rel}: {lines} lines, and its docstring does not say why")
    return out


def private_reaches(root: str) -> list[str]:
    """``x._name`` in the store's parts where ``x`` is not ``self`` or ``cls`` (dunders aside)."""
    out = []
    for module, path in sorted(modules(root).items()):
        rel = os.path.relpath(path, root)
        if not rel.startswith(PARTS):
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    out.append(f"{module} line {node.lineno}: {ast.unparse(node)}")
    return sorted(out)


# ------------------------------------------------------------ the project
def test_the_daemon_imports_neither_the_client_nor_the_tools():
    assert daemon_imports_upward(data_root()) == []


def test_the_client_imports_nothing_of_the_tools():
    assert client_imports_the_tools(data_root()) == []


def test_the_client_reaches_the_daemon_only_through_the_contract():
    assert client_imports_beyond_the_wire(data_root()) == []


def test_no_import_cycles():
    found = set(cycles(data_root()))
    new = [sorted(c) for c in found - KNOWN_CYCLES.keys()]
    assert new == [], f"import cycles (each member imports the next, around): {new}"
    assert KNOWN_CYCLES.keys() - found == set(), "a known cycle is gone: remove its entry from KNOWN_CYCLES"


def test_the_stores_parts_touch_no_private_attribute_of_another():
    assert private_reaches(data_root()) == []


def test_every_long_file_says_why():
    assert long_files_without_a_reason(data_root()) == []


def test_the_engine_client_loads_nothing_of_the_daemon_server():
    code = (
        f"import sys\nfor m in {CLIENT_MODULES!r}: __import__(m)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('kvstore.server'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=data_root(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ------------------------------------------------------------ the checks themselves
def _tree(tmp_path, files: dict[str, str]) -> str:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_each_check_catches_what_it_is_for(tmp_path):
    root = _tree(
        tmp_path,
        {
            "kvstore/contract/__init__.py": "",
            "kvstore/contract/geometry.py": "",
            "kvstore/store.py": "def f():\n    from engine_client import client\n",
            "kvstore/cli.py": "import kvstore_tools.demo\n",
            "kvstore/reader.py": "",
            "engine_client/client.py": "from kvstore.contract import pb\nfrom kvstore.contract import geometry\nfrom kvstore.reader import ReadResult\n",
            "engine_client/runner.py": "def g():\n    import kvstore\n",
            "engine_client/tasks.py": "from kvstore_tools.tasks import text\n",
            "kvstore_tools/demo.py": "from .fmt import human_bytes\n",
            "kvstore_tools/fmt.py": "def h():\n    from . import demo\n",
            "kvstore_tools/synthetic.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .admin import x\n",
            "kvstore_tools/admin.py": "from .synthetic import y\n",
            "kvstore_tools/long.py": '"""Short."""\n' + "x = 1\n" * MAX_LINES,
            "kvstore_tools/long_with_reason.py": '"""Long.\n\nWhy: one table."""\n' + "x = 1\n" * MAX_LINES,
            "kvstore/contract/_proto/stub.py": "x = 1\n" * (MAX_LINES + 1),
            "kvstore/store/parts.py": "class A:\n    def f(self, other):\n        return self._x, other._y, other.__class__\n",
        },
    )
    assert daemon_imports_upward(root) == [
        "kvstore.cli line 1 imports kvstore_tools.demo",
        "kvstore.store line 2 imports engine_client.client",
    ]
    assert client_imports_the_tools(root) == ["engine_client.tasks line 1 imports kvstore_tools"]
    assert client_imports_beyond_the_wire(root) == [
        "engine_client.client line 3 imports kvstore.reader",
        "engine_client.runner line 2 imports kvstore",
    ]
    assert sorted(map(sorted, cycles(root))) == [
        ["kvstore_tools.admin", "kvstore_tools.synthetic"],
        ["kvstore_tools.demo", "kvstore_tools.fmt"],
    ]
    assert private_reaches(root) == ["kvstore.store.parts line 3: other._y"]
    assert long_files_without_a_reason(root) == [f"kvstore_tools/long.py: {MAX_LINES + 1} lines, and its docstring does not say why"]
