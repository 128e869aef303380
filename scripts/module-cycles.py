#!/usr/bin/env python3
"""Import cycles between the modules of one crate.

    python3 scripts/module-cycles.py host/runtime/src [DEPTH]

Reads every `.rs` file under the crate's source directory, takes the paths
it names (`crate::a::b`, `super::a`, `use child::..`; comments, the
`#[cfg(test)] mod tests` block at a file's end and `tests.rs` files, the
same block in a file of its own, left out), maps each to the
deepest module that exists, cut to DEPTH levels (default 2: `tiering::store`),
and prints every strongly connected component of more than one module with
the edges inside it. A re-export (`pub use child::T`) counts as a use. Exit
status 1 when there is a cycle.
"""
import os
import re
import sys
from collections import defaultdict


def modules(root):
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs") or name == "tests.rs":
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            found["::".join(parts)] = path
    return found


def references(module, path, names):
    text = open(path).read()
    tests = text.find("#[cfg(test)]\nmod tests")
    if tests >= 0:
        text = text[:tests]
    text = re.sub(r"//[^\n]*", "", text)
    here = module.split("::") if module else []
    owns_children = path.endswith(("mod.rs", "lib.rs", "main.rs"))
    parent = here if owns_children else here[:-1]
    refs = set()
    for m in re.finditer(r"crate::((?:\w+::)*\w+)", text):
        refs.add(tuple(m.group(1).split("::")))
    for m in re.finditer(r"use crate::\{([^;]*)\};", text, re.S):
        for item in re.split(r",\s*(?![^{]*\})", m.group(1)):
            item = item.split("{")[0].strip(": \n")
            if item:
                refs.add(tuple(item.split("::")))
    for m in re.finditer(r"super::((?:\w+::)*\w+)", text):
        refs.add(tuple(here[:-1] + m.group(1).split("::")))
    for m in re.finditer(r"(?:\buse\s+|self::)((?:\w+::)+\w+)", text):
        first = m.group(1).split("::")[0]
        if first not in ("crate", "super", "self", "std", "core", "alloc"):
            candidate = parent + m.group(1).split("::")
            if "::".join(parent + [first]) in names:
                refs.add(tuple(candidate))
    return refs


def main():
    root = sys.argv[1]
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    found = modules(root)
    names = set(found)
    cut = lambda parts: "::".join(parts[:depth])
    edges = defaultdict(set)
    for module, path in found.items():
        me = cut(module.split("::")) if module else ""
        for ref in references(module, path, names):
            parts = list(ref)
            while parts and "::".join(parts) not in names:
                parts.pop()
            target = cut(parts)
            if parts and target != me:
                edges[me].add(target)

    index, low, stack, on_stack, components = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(component)

    nodes = set(edges) | {w for targets in edges.values() for w in targets}
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    cycles = [sorted(c) for c in components if len(c) > 1]
    for cycle in cycles:
        print("cycle:", ", ".join(cycle))
        inside = set(cycle)
        for v in cycle:
            print(f"    {v} -> {', '.join(sorted(w for w in edges[v] if w in inside))}")
    print(f"{len(cycles)} cycle(s) among {len(nodes)} modules (depth {depth})")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
