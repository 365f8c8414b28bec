"""Shape rules the code keeps so that a reader can follow it.

- No function in controller/ runs longer than 60 lines, and the control
  round, decide(), is at most 40: a round is a sequence of named steps
  (controller/engine/round.py), not one long body.
- No module docstring runs longer than 25 lines: it says what the module
  is and why it is shaped so; the detail lives where it is used or in
  docs/internals.md.
- No module does work when it is imported (a bare call at module level):
  importing a module must not change the process, as the engine's old
  mallopt() call did.
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("root", "core", "models", "protocol", "sim", "agent", "controller")
GENERATED = ("_pb2.py", "_pb2_grpc.py")
MAX_CONTROLLER_FUNCTION = 60
MAX_DECIDE = 40


def sources(*folders):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if not path.name.endswith(GENERATED):
                yield path


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def long_functions(limit: int, *folders) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} {name}() is {n} lines"
            for p in sources(*folders) for name, line, n in functions(p) if n > limit]


def test_no_function_in_the_controller_is_longer_than_80_lines():
    too_long = long_functions(MAX_CONTROLLER_FUNCTION, "controller")
    assert not too_long, "\n".join(too_long)


def test_decide_is_at_most_40_lines():
    path = ROOT / "controller" / "engine" / "__init__.py"
    lengths = {name: n for name, _, n in functions(path)}
    assert "decide" in lengths
    assert lengths["decide"] <= MAX_DECIDE, f"decide() is {lengths['decide']} lines"


def module_level_calls(path: Path) -> list[str]:
    """Bare calls among a module's top-level statements (outside
    `if __name__ == "__main__":`)."""
    out = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            out.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:60]}")
    return out


def test_no_module_does_work_on_import():
    found = [c for p in sources(*PACKAGES) for c in module_level_calls(p)]
    assert not found, "\n".join(found)


# -- the checks see what they are meant to see ----------------------------------

def test_the_checks_catch_a_long_function_and_a_call_on_import(tmp_path):
    src = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    src.write_text(f'"""doc"""\nimport os\nos.umask(0)\n\n\ndef f():\n{body}\n')
    assert [n for name, _, n in functions(src) if name == "f"] == [86]
    assert module_level_calls(src) == ["m.py:3 os.umask(0)"]


@pytest.mark.parametrize("folder", PACKAGES)
def test_every_package_folder_exists(folder):
    assert (ROOT / folder / "__init__.py").is_file()


# -- the policy library's shared code -------------------------------------------

POLICY_SOURCES = ROOT / "bpf" / "policies"
# the fresh bit tested or cleared by hand: `if (page->fresh)`, `p.fresh = 0`
HAND_FRESH = re.compile(r"if\s*\(\s*!?\s*[\w>.-]+(?:->|\.)fresh\s*\)|(?:->|\.)fresh\s*=\s*0\b")


def hand_written_fresh(path: Path) -> list[str]:
    return [f"{path.relative_to(path.parents[1])}:{i} {line.strip()}"
            for i, line in enumerate(path.read_text().splitlines(), 1)
            if HAND_FRESH.search(line)]


# the header's helpers for the fresh bit: cp_first_access() and the use
# counts built on it
FRESH_HELPERS = re.compile(r"\bcp_(?:first_access|count_reuse|count_use)\(")


def test_policies_use_the_headers_first_access_helper():
    """The read that brings a page in is not a reuse: every policy says so
    through cp_first_access() in the policy header (directly or through the
    use counts built on it), none by hand."""
    found = [h for p in sorted(POLICY_SOURCES.rglob("*.bpf.c")) for h in hand_written_fresh(p)]
    assert not found, "\n".join(found)
    users = [p.name for p in POLICY_SOURCES.rglob("*.bpf.c")
             if FRESH_HELPERS.search(p.read_text())]
    assert len(users) >= 6, users


def test_the_fresh_check_sees_a_hand_written_copy(tmp_path):
    src = tmp_path / "policies" / "x.bpf.c"
    src.parent.mkdir()
    src.write_text("if (page->fresh) {\n\tpage->fresh = 0;\n\treturn;\n}\n"
                   "struct p page = { .fresh = 1 };\nif (cp_first_access(&page->fresh))\n")
    assert [h.split(" ", 1)[0] for h in hand_written_fresh(src)] == ["policies/x.bpf.c:1",
                                                                    "policies/x.bpf.c:2"]


MAX_MODULE_DOC = 25


def test_no_module_docstring_is_longer_than_25_lines():
    long = []
    for path in sources(*PACKAGES):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc and doc.count("\n") + 1 > MAX_MODULE_DOC:
            long.append(f"{path.relative_to(ROOT)}: {doc.count(chr(10)) + 1} lines")
    assert not long, long
