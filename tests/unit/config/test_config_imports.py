"""The import structure of config/ and convert/: no circle (imports under TYPE_CHECKING and
inside functions count), config/ never imports convert/ (which stands above it), the NeMo-RL
key map both read imports nothing of the package, and no file is over 700 lines.

Before, the schema ran the cross-field checks, which imported the schema back (through
worker_split too), and convert/nemo_rl.py and nemo_rl_sections.py imported each other.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "nemo_opd"
ROOMS = [*sorted((PACKAGE / "config").glob("*.py")), *sorted((PACKAGE / "convert").glob("*.py"))]
KEY_MAP = PACKAGE / "nemo_rl_keys.py"


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The nemo_opd modules a file imports anywhere in it (a name imported from a package is
    the module of that name when there is one)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    known = {module_of(path) for path in PACKAGE.rglob("*.py")}
    return {name for name in names if name in known and name != "nemo_opd"}


def graph() -> dict[str, set[str]]:
    """module -> the modules of config/, convert/ and the key map it imports; a package's face
    (__init__.py, which only hands names on) is left out, as farm-studio draws the house."""
    files = [path for path in [*ROOMS, KEY_MAP] if path.name != "__init__.py"]
    modules = {module_of(path) for path in files}
    return {module_of(path): imported(path) & modules for path in files}


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle among the modules of `edges`, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = "open", stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[node], _ = "done", stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_in_config_or_convert():
    found = circle(graph())
    assert found is None, " -> ".join(found)


def test_the_check_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None


def test_config_stands_below_convert_and_the_key_map_below_both():
    for path in (PACKAGE / "config").glob("*.py"):
        assert not any(name.startswith("nemo_opd.convert") for name in imported(path)), path
    assert imported(KEY_MAP) == set()


def test_no_file_over_700_lines():
    for path in [*ROOMS, KEY_MAP]:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 700, f"{path.relative_to(PACKAGE.parent)}: {lines} lines"
