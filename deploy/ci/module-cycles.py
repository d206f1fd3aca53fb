#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

For every crate under crates/, each source file under src/ is a module (`db/deliveries.rs` is
`db::deliveries`, `db/mod.rs` is `db`, `lib.rs` and `main.rs` the crate root). A module depends
on another when it names it through a path: `use crate::a::b::X`, `super::x::Y`,
`self::sub::Z`, in `use` trees with braces too, or in a path in the code. A path that ends at a
module's re-export (`pub use event::EventKind` in lib.rs) counts as a dependency on the module
the item comes from.

A parent and its children are not a circle: the parent declares and assembles its children,
and they use the shared helpers it holds. A circle is between siblings: a dependency from
anywhere inside module `a` to anywhere inside its sibling `b` is an edge `a -> b`, and the
siblings under each parent (the crate root's modules, `db`'s, `routes`'...) must not depend on
each other in a circle, of any length. Each circle is reported with the file-level imports that
make it.

Why a script of ours: cargo-modules (crates.io) reports cycles but builds rust-analyzer's
crates first (many minutes on a 2-core machine, in every CI run); this reads the sources in
well under a second and needs only Python, which the test command installs anyway.

Usage: deploy/ci/module-cycles.py [ROOT]   (ROOT: the repository, by default this script's;
exit 1 and the circles when there is one)
"""

import re
import sys
from pathlib import Path

TOKEN = re.compile(
    r"""
      (?P<comment>//[^\n]*|/\*.*?\*/)
    | (?P<raw>r(?P<hashes>\#*)"(?:.|\n)*?"(?P=hashes))
    | (?P<string>b?"(?:\\.|[^"\\])*")
    | (?P<char>b?'(?:\\.|[^'\\])')
    """,
    re.VERBOSE | re.DOTALL,
)


def strip(source: str) -> str:
    """The source without comments, strings or character literals (kept as blanks of the same
    lines), so that braces and paths in them are not read."""

    def blank(match: re.Match) -> str:
        return "".join("\n" if c == "\n" else " " for c in match.group(0))

    return TOKEN.sub(blank, source)


def module_path(src: Path, file: Path) -> tuple:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def use_trees(text: str, start: int) -> list:
    """Expands the use tree starting at `start` (just after `crate::`, `super::` or `self::`)
    into lists of segments."""
    paths = []

    def parse(pos: int, prefix: list) -> int:
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if text.startswith("{", pos):
                pos += 1
                while True:
                    while pos < len(text) and text[pos] in " \t\n,":
                        pos += 1
                    if pos >= len(text) or text[pos] == "}":
                        return pos + 1
                    pos = parse(pos, list(prefix))
            match = re.compile(IDENT).match(text, pos)
            if not match:
                paths.append(prefix)
                return pos
            prefix = prefix + [match.group(0)]
            pos = match.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if text.startswith("::", pos):
                pos += 2
                continue
            paths.append(prefix)
            # `as name` and the rest of the tree item.
            rename = re.compile(r"\s*as\s+" + IDENT).match(text, pos)
            return rename.end() if rename else pos

    parse(start, [])
    return paths


def inline_modules(text: str):
    """(start, end, name) of each inline `mod name { ... }` block."""
    blocks = []
    for match in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
        depth, pos = 1, match.end()
        while depth and pos < len(text):
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            pos += 1
        blocks.append((match.start(), pos, match.group(1)))
    return blocks


def references(text: str, here: tuple) -> list:
    """Absolute module paths (with the item names after them) that `text`, the module `here`,
    names."""
    found = []
    blocks = inline_modules(text)
    for match in re.finditer(r"\b((?:crate|self|super)(?:\s*::\s*super)*)\s*::", text):
        keyword = re.sub(r"\s", "", match.group(1))
        # Inline modules around this path deepen `self` and `super`.
        inner = [b[2] for b in blocks if b[0] < match.start() < b[1]]
        base = list(here) + inner
        if keyword.startswith("crate"):
            base = []
        else:
            for part in keyword.split("::"):
                if part == "super":
                    base = base[:-1]
        for segments in use_trees(text, match.end()):
            found.append(tuple(base + segments))
    return found


def reexports(text: str, here: tuple) -> dict:
    """Names a module re-exports with `pub use`: name -> the path it comes from."""
    names = {}
    for match in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+", text):
        for segments in use_trees(text, match.end()):
            if not segments or segments[0] in ("std", "core", "alloc"):
                continue
            if segments[0] == "crate":
                path = tuple(segments[1:])
            elif segments[0] in ("self", "super"):
                continue
            else:
                path = here + tuple(segments)
            names[segments[-1]] = path
    return names


def resolve(path: tuple, modules: set, exports: dict) -> tuple:
    """The deepest module `path` names, following one re-export of the module it stops at."""
    for length in range(len(path), -1, -1):
        module = path[:length]
        if module in modules:
            rest = path[length:]
            if rest and rest[0] in exports.get(module, {}):
                target = exports[module][rest[0]]
                for inner in range(len(target), -1, -1):
                    if target[:inner] in modules and target[:inner] != module:
                        return target[:inner]
            return module
    return ()


def related(a: tuple, b: tuple) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def crate_cycles(src: Path) -> list:
    files = {}
    for file in sorted(src.rglob("*.rs")):
        files[module_path(src, file)] = strip(file.read_text())
    modules = set(files)
    exports = {m: reexports(text, m) for m, text in files.items()}
    # parent -> sibling -> siblings it depends on; and the file-level imports behind each edge.
    levels, why = {}, {}
    for module, text in files.items():
        for path in references(text, module):
            target = resolve(path, modules, exports)
            if related(module, target):
                continue
            depth = 0
            while module[depth] == target[depth]:
                depth += 1
            parent, a, b = module[:depth], module[: depth + 1], target[: depth + 1]
            levels.setdefault(parent, {}).setdefault(a, set()).add(b)
            why.setdefault((a, b), set()).add((module, target))
    found = []
    for parent in sorted(levels):
        for component in cycles(levels[parent]):
            names = set(component)
            lines = []
            for a in component:
                for b in sorted(levels[parent][a] & names):
                    for module, target in sorted(why[(a, b)]):
                        lines.append(f"    {show(module)} -> {show(target)}")
            found.append("\n".join(lines))
    return found


def show(module: tuple) -> str:
    return "::".join(module) or "crate"


def self_test() -> None:
    """The check finds a circle of siblings (through a nested module and a brace group) and
    leaves a parent with its children alone."""
    import tempfile

    crate = {
        "lib.rs": "mod a;\nmod b;\nmod c;\npub use a::Shared;\n",
        "a/mod.rs": "pub mod inner;\npub struct Shared;\nuse self::inner::X;\n",
        "a/inner.rs": "use crate::{b::{Y, Z as W}};\nuse super::Shared;\npub struct X;\n",
        "b.rs": "// crate::c::Nothing is a comment\nfn f() { let _ = \"crate::c::No\"; crate::c::go(); }\n",
        "c.rs": "pub fn go() { let _ = crate::Shared; }\n",
    }
    with tempfile.TemporaryDirectory() as root:
        src = Path(root, "crates/demo/src")
        for name, text in crate.items():
            Path(src, name).parent.mkdir(parents=True, exist_ok=True)
            Path(src, name).write_text(text)
        found = crate_cycles(src)
        assert len(found) == 1, found
        for edge in ["a::inner -> b", "b -> c", "c -> a"]:
            assert edge in found[0], (edge, found[0])
        Path(src, "c.rs").write_text("pub fn go() {}\n")
        assert crate_cycles(src) == [], crate_cycles(src)
    print("self-test: a circle of three siblings found, none once it is opened")


def main() -> int:
    self_test()
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    failed = False
    for src in sorted(root.glob("crates/*/src")):
        for cycle in crate_cycles(src):
            failed = True
            print(f"{src.parent.name}: modules import each other in a circle:\n{cycle}")
    if not failed:
        print("no import circle between the modules of any crate")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
