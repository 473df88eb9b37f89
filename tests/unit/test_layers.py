"""The layer rule (docs/architecture.md): common <- topologies <- traffic <- analysis <- testbed,
no cycles."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("deps", ROOT / "scripts" / "deps.py")
deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deps)


def test_no_import_against_the_layer_rule_and_no_cycle():
    known, graph, pkg_edges, bad, cycles, unexplained = deps.analyse()
    assert len(known) > 50
    assert bad == []
    assert cycles == []
    assert unexplained == []
    assert all(deps.RANK[b] <= deps.RANK[a] for a, b in pkg_edges)


def test_the_checker_sees_an_import_hidden_in_a_function(tmp_path, monkeypatch):
    pkg = tmp_path / "topologies"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("def f():\n    import traffic.y\n")
    tr = tmp_path / "traffic"
    tr.mkdir()
    (tr / "__init__.py").write_text("")
    (tr / "y.py").write_text("import topologies.x\n")
    for p in ("analysis", "testbed"):
        (tmp_path / p).mkdir()
    monkeypatch.setattr(deps, "ROOT", tmp_path)
    _, _, _, bad, cycles, unexplained = deps.analyse()
    assert bad == ["topologies/x.py:2 imports traffic.y (topologies may not import traffic)"]
    assert cycles == [["topologies.x", "traffic.y"]]
    assert unexplained == ["topologies/x.py:2 imports traffic.y inside a function"]
