"""The packages' import graph has no cycle between any two modules, TYPE_CHECKING and function-level imports
included (docs/architecture.md, Layout). import-linter's ``acyclic_siblings`` contract looks at siblings only;
this looks at every module, a package's ``__init__`` among them."""

import graphlib
from pathlib import Path

import grimp

import smith_worker

PACKAGES = ("smith_client", "smith_worker")


def first_cycle(graph: grimp.ImportGraph) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, …, a]`` (each module imports the one before it), or None."""
    sorter = graphlib.TopologicalSorter({m: graph.find_modules_directly_imported_by(m) for m in graph.modules})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def package_graph() -> grimp.ImportGraph:
    """The import graph of :data:`PACKAGES`, TYPE_CHECKING imports included, read afresh (no cache)."""
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)


def test_no_module_of_the_packages_is_in_an_import_cycle():
    graph = package_graph()
    assert len(graph.modules) > 100  # both packages were read
    assert first_cycle(graph) is None


def test_a_cycle_would_be_found():
    graph = package_graph()
    graph.add_import(importer="smith_worker.ops.retry", imported="smith_worker.mcp.transport")  # which imports it
    # the graph had no cycle, so the one found runs through the new import
    assert {"smith_worker.ops.retry", "smith_worker.mcp.transport"} <= set(first_cycle(graph) or ())


#: Modules a folder of the worker holds at most, its ``__init__`` not counted (docs/architecture.md, Layout):
#: past this a folder no longer says one thing, and is split by role.
MODULES_PER_FOLDER = 12


def test_no_worker_folder_holds_more_than_twelve_modules():
    root = Path(smith_worker.__file__).parent
    folders = [root, *(p for p in root.iterdir() if (p / "__init__.py").exists())]
    sizes = {p.name: len([m for m in p.glob("*.py") if m.name != "__init__.py"]) for p in folders}
    assert len(sizes) > 10 and sizes["mcp"] > 0  # every folder was read
    assert {name: n for name, n in sizes.items() if n > MODULES_PER_FOLDER} == {}
