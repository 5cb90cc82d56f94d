"""The import structure of the whole package: no circle anywhere (imports under TYPE_CHECKING
and inside functions count), no file over 700 lines, and the rooms that stand below others
import none of them (docs/design.md, "The floors of the package").

Before, policy/ and teachers/ imported each other (the workers ran the cross-tokenizer
rendering that teachers/ held), the engine base and its scoring module imported each other,
and utils/hf_export.py reached up into the policy's engines.
"""

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nemo_opd"
MAX_LINES = 700
NEVER = {
    "nemo_opd.policy": ("nemo_opd.teachers", "nemo_opd.algorithms"),
    "nemo_opd.scoring": ("nemo_opd.policy", "nemo_opd.teachers", "nemo_opd.algorithms"),
    "nemo_opd.utils": ("nemo_opd.policy", "nemo_opd.teachers", "nemo_opd.algorithms"),
    "nemo_opd.config": ("nemo_opd.convert", "nemo_opd.policy", "nemo_opd.algorithms"),
    "nemo_opd.models": ("nemo_opd.",),
    "nemo_opd.nemo_rl_keys": ("nemo_opd.",),
    "nemo_opd.errors": ("nemo_opd.",),
}
"""{room: prefixes of the modules it never imports} (a room stands below them)."""


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in it; `from package import name`
    is an import of the submodule `name` when there is one, else of the package (its
    __init__.py)."""
    modules = {module_of(path): path for path in PACKAGE.rglob("*.py")}
    edges = {}
    for module, path in modules.items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    names.add(submodule if submodule in modules else node.module)
        edges[module] = {name for name in names if name in modules} - {module}
    return edges


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle among the modules of `edges` (each importing the next), or None."""
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as error:
        return list(reversed(error.args[1]))  # graphlib lists each module's importer next
    return None


def test_no_import_circle_in_the_package():
    found = circle(graph())
    assert found is None, " -> ".join(found)


def test_the_check_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None


def in_room(module: str, room: str) -> bool:
    return module == room or module.startswith(f"{room}.")


def test_lower_rooms_import_none_above_them():
    broken = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for room, above in NEVER.items()
        if in_room(module, room)
        for target in targets
        if target.startswith(above) and not in_room(target, room)  # its own modules: level
    ]
    assert not broken, broken


def test_no_file_over_700_lines():
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long
