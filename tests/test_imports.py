"""The shape of memwall's imports: the readable engine names no backend, and nothing imports in a
circle (deferred imports inside functions included), so each module can be read on its own."""

import ast
from pathlib import Path

import memwall

PACKAGE = Path(memwall.__file__).parent
# The textbook: a student reads these top to bottom and meets no kernel, dispatch or timing.
READABLE = (
    "memwall.engine.model",
    "memwall.engine.layers",
    "memwall.engine.linear",
    "memwall.engine.quant",
    "memwall.engine.kv_cache",
    "memwall.engine.paged_cache",
    "memwall.engine.phases",
    "memwall.engine.sampling",
    "memwall.engine.batch",
    "memwall.engine.speculative",
    "memwall.engine.kv_heads",
    "memwall.engine.kv_quant",
    "memwall.engine.sharing",
    "memwall.engine.scheduler",
    "memwall.engine.block_manager",
    "memwall.engine.drafts",
    "memwall.engine.sequence",
)
BACKENDS = ("memwall.engine.cpu", "memwall.engine.cuda", "memwall.engine.accelerate")


def module_files() -> dict[str, Path]:
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    return files


def imports_of(path: Path, modules: dict) -> set[str]:
    """The memwall modules `path` imports anywhere in its body. `from package import name` names
    the submodule when `name` is one (Python loads the package first, which is not a choice)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules}


def graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for after in edges[node]:
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_no_module_imports_in_a_circle():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_deferred_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_readable_engine_names_no_backend():
    edges = graph()
    for name in READABLE:
        assert name in edges, f"{name} is gone: update READABLE"
        backends = {m for m in edges[name] if m.startswith(BACKENDS)}
        assert not backends, f"{name} imports {sorted(backends)}"
