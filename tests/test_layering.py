"""The top-level packages import one another in one direction only.

Every import in every module of the top-level packages is read with ast --
function-local ones included, so an import tucked into a function to dodge
a cycle counts like any other.  The agent and the controller never import
each other (what they share is in the protocol package), and the graph of
imports between the top-level packages has no cycle.  The layering it
checks is the one docs/design.md draws.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def import_map() -> dict[str, str]:
    """Import name -> folder, read from setup.py's ROOTS (not restated)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "ROOTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ROOTS mapping")


ROOTS = import_map()
# the top-level package a dotted import name belongs to: the longest prefix
PACKAGES = sorted(ROOTS, key=len, reverse=True)


def package_of(name: str) -> str | None:
    for pkg in PACKAGES:
        if name == pkg or name.startswith(pkg + "."):
            return pkg
    return None


def module_name(pkg: str, path: Path) -> str:
    rel = path.relative_to(ROOT / ROOTS[pkg]).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([pkg, *parts])


def imports_of(path: Path, modname: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, at any depth."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = modname.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from cachepilot import agent` imports cachepilot.agent; the
            # bare root package, which every import loads, is no edge
            if target != "cachepilot":
                out.append((node.lineno, target))
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return out


def edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> where, for distinct packages."""
    found: dict[tuple[str, str], list[str]] = {}
    for pkg, folder in ROOTS.items():
        base = ROOT / folder
        # the root package's folder holds only its own modules; the others'
        # subfolders are their subpackages
        files = base.glob("*.py") if pkg == "cachepilot" else base.rglob("*.py")
        for path in sorted(files):
            if ".venv" in path.parts:
                continue
            mod = module_name(pkg, path)
            for line, target in imports_of(path, mod):
                other = package_of(target)
                if other is None or other == pkg:
                    continue
                found.setdefault((pkg, other), []).append(
                    f"{path.relative_to(ROOT)}:{line} imports {target}")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_map_names_every_package_folder():
    for pkg, folder in ROOTS.items():
        assert (ROOT / folder / "__init__.py").is_file(), (pkg, folder)
    assert {"cachepilot.agent", "cachepilot.controller",
            "cachepilot.protocol"} <= set(ROOTS)


@pytest.mark.parametrize("a,b", [("cachepilot.agent", "cachepilot.controller"),
                                 ("cachepilot.controller", "cachepilot.agent")])
def test_agent_and_controller_do_not_import_each_other(a, b):
    where = edges().get((a, b), [])
    assert not where, f"{a} imports {b}:\n" + "\n".join(where)


def test_no_cycle_between_top_level_packages():
    found = edges()
    graph: dict[str, set[str]] = {}
    for a, b in found:
        graph.setdefault(a, set()).add(b)
    cycle = find_cycle(graph)
    if cycle:
        where = [w for a, b in zip(cycle, cycle[1:]) for w in found[(a, b)][:3]]
        pytest.fail("import cycle " + " -> ".join(cycle) + ":\n" + "\n".join(where))


# -- the checker itself must see what it is meant to see ------------------------

def test_checker_sees_function_local_and_relative_imports(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from cachepilot.controller import service\n"
                   "from ..protocol import wire\nimport cachepilot.models.mrc\n")
    found = dict((t, ln) for ln, t in imports_of(src, "cachepilot.agent.mod"))
    assert found["cachepilot.controller"] == 2
    assert found["cachepilot.controller.service"] == 2
    assert "cachepilot.protocol.wire" in found
    assert "cachepilot" not in found
    assert package_of("cachepilot.models.mrc") == "cachepilot.models"


def test_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None
