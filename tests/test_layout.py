"""The code's map holds (docs/architecture.md): clarify's modules import each other without a
cycle, `batch/`'s wings are layered (the command doors over the comparison, the report, the run machinery,
the algorithm and the settings, each importing only the wings below it), `eval/` uses nothing of `batch/`
but the run reader, `index/` and `local_llm/` know nothing of `batch/`, nor `local_llm/` of retrieval or
evaluation, nor `index/` of evaluation; the shared modules at the top import none of the four.

Read from the source with `ast` (every `import`, function-level ones included: a lazy import is still a
dependency), so the check costs milliseconds and needs no heavy library."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("batch", "index", "local_llm", "eval")


def _modules() -> dict[str, Path]:
    out = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    for path in sorted(ROOT.glob("*.py")):  # the shared pieces at the top: schemas.py, files.py, ...
        out[path.stem] = path
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = (node.module or "").removeprefix("clarify.")
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.removeprefix("clarify.") for a in node.names]
            else:
                continue
            # `from clarify.batch import config` is an edge to batch.config; a package's __init__ counts only
            # when the import names it alone
            graph[name] |= {t for t in names if t in mods and t != name and not (t in FOLDERS and len(names) > 1)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out = set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = _graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 150  # the whole code was read
    assert _cycles(graph) == []


def test_each_part_imports_only_what_the_map_allows():
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith("eval"):
            allowed = {"batch.run.rundir"} if mod == "eval.cli" else set()  # `clarify eval` on a run: Run.open
            assert {d for d in deps if d.startswith("batch")} <= allowed, (mod, deps)
        if mod.startswith(("local_llm", "index")):
            assert not any(d.startswith("batch") for d in deps), (mod, deps)
        if mod.startswith("index"):  # what AC@k shares with the metrics is at the top (normalize.py, asqa_file.py)
            assert not any(d.startswith("eval") for d in deps), (mod, deps)
        if "." not in mod and mod not in FOLDERS:  # the shared pieces lie below the four folders
            assert not any(d.split(".")[0] in FOLDERS for d in deps), (mod, deps)
        if mod.startswith("local_llm"):
            assert not any(d.startswith(("eval", "index")) for d in deps), (mod, deps)


# batch/'s wings, each with the wings it may import (docs/architecture.md#batch-in-wings): the doors (the
# `clarify` parser and the commands) over everything; the comparison over the report and the run; the report
# over the run it reads; the run machinery over the algorithm it drives; the algorithm over its settings.
# The settings' schema imports two enums of the algorithm's leaves (toc.parsing's and toc.matching's values,
# beside the parser and the matcher they choose), which import nothing of batch/: TOC_LEAVES.
WINGS = {
    "cli": {"compare", "config", "report", "run", "toc"},
    "compare": {"config", "report", "run"},
    "report": {"config", "run", "toc"},
    "run": {"config", "toc"},
    "toc": {"config"},
    "config": set(),
}
TOC_LEAVES = {"batch.toc.format", "batch.toc.match"}


def _wing(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if parts[0] == "batch" and len(parts) > 1 else None


def _wing_problems(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) for every import across batch/'s wings that WINGS does not allow."""
    out = []
    for mod, deps in graph.items():
        if (wing := _wing(mod)) is None:
            continue
        for dep in sorted(deps):
            to = _wing(dep)
            if dep == "batch" or (to is not None and to not in WINGS):
                out.append((mod, dep))  # a module back in the flat hall, or a wing the map does not name
            elif to is not None and to != wing and to not in WINGS[wing]:
                if not (wing == "config" and dep in TOC_LEAVES):
                    out.append((mod, dep))
        if mod in TOC_LEAVES:
            out += [(mod, d) for d in sorted(deps) if _wing(d) not in (None, "toc")]
    return out


def test_the_wing_check_finds_a_forbidden_import():
    ok = {"batch.cli.x": {"batch.run.y"}, "batch.run.y": {"batch.toc.z"}, "batch.toc.z": set(),
          "batch.config.schema": {"batch.toc.format"}, "batch.toc.format": set()}
    assert _wing_problems(ok) == []
    assert _wing_problems({**ok, "batch.run.y": {"batch.cli.x"}}) == [("batch.run.y", "batch.cli.x")]
    assert _wing_problems({**ok, "batch.config.schema": {"batch.toc.tree"}}) == [("batch.config.schema", "batch.toc.tree")]
    assert _wing_problems({**ok, "batch.toc.format": {"batch.config.schema"}}) == [("batch.toc.format", "batch.config.schema")]
    assert _wing_problems({**ok, "batch.thing": set(), "batch.run.y": {"batch.thing"}}) == [("batch.run.y", "batch.thing")]


def test_batch_is_in_wings_each_importing_only_the_wings_below_it():
    graph = _graph()
    assert {_wing(m) for m in graph if m.startswith("batch.")} == set(WINGS)  # nothing left in the flat hall
    assert _wing_problems(graph) == []
    wings = {w: {_wing(d) for m, deps in graph.items() if _wing(m) == w for d in deps} - {w, None} for w in WINGS}
    wings["config"] -= {"toc"}  # through TOC_LEAVES only, checked above
    assert _cycles(wings) == []


def test_the_tree_reads_only_its_part_of_the_settings():
    """The tree program, its grammars and the tree's state get `TreeSettings` (batch/toc/settings.py, the one
    module that reads a RunConfig), never the whole run config: nothing else in batch/toc/ names RunConfig."""
    for path in sorted((ROOT / "batch" / "toc").glob("*.py")):
        if path.name == "settings.py":
            continue
        names = {a.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.ImportFrom) for a in node.names}
        assert "RunConfig" not in names, path.name
