"""A run's provenance (:mod:`common.provenance`): what it records, that the commit is the
project's own (git run in the package's directory, never the caller's), None instead of an
error without git or a checkout, the comment block of a run's ``spec.yaml`` (which still loads
and runs as without it), and ``testbed check --cluster``'s comparison of the code on each
machine (:func:`testbed.cluster.compare_source`, :func:`testbed.cluster.check_machine` with
a machine whose answers are faked)."""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from common import provenance
from common.provenance import (
    PROVENANCE_FILE,
    RUNTIME_PACKAGES,
    Provenance,
    changes_digest,
    code_digest,
    collect,
    source_revision,
)
from testbed import cluster
from testbed.cluster import Machine, Source, check_machine, compare_source
from testbed.spec import dump_spec, from_dict, load_spec, write_spec
from traffic import rundir

ROOT = Path(__file__).resolve().parents[2]
HAS_GIT = shutil.which("git") is not None


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", f"safe.directory={cwd}", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _repo(path: Path, text: str = "a\n") -> Path:
    """A git repository at ``path`` with one committed file ``f``."""
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    (path / "f").write_text(text)
    _git(path, "add", "f")
    _git(path, "commit", "-q", "-m", "one")
    return path


def _is_checkout(path: Path) -> bool:
    r = subprocess.run(
        ["git", "-c", f"safe.directory={path}", "rev-parse", "--show-toplevel"],
        cwd=path,
        capture_output=True,
        text=True,
    )
    return r.returncode == 0 and Path(r.stdout.strip()).resolve() == path.resolve()


# ----------------------------------------------------------------------------- the record


def test_collect_records_every_field():
    when = datetime(2026, 11, 23, 4, 25, 36, tzinfo=UTC)
    p = collect(argv=["testbed", "run", "spec.yaml"], started_at=when)
    doc = p.dump()
    assert set(doc) >= {
        "project_version",
        "commit",
        "dirty",
        "python",
        "torch",
        "mininet",
        "kernel",
        "machine",
        "started_at",
        "argv",
    }
    assert set(doc["machine"]) >= {"hostname", "cpu_model", "cores_logical", "cores_physical", "memory_bytes"}
    assert p.project_version == provenance.distribution_version("dl-netbed") is not None
    assert p.python == platform.python_version() and p.kernel == platform.release()
    assert p.torch is not None and p.torch.startswith("2.13.0")
    assert p.machine.cores_logical >= 1 and p.machine.memory_bytes > 0 and p.machine.cpu_model
    assert p.started_at == "2026-11-23T04:25:36+00:00" and p.argv == ["testbed", "run", "spec.yaml"]
    assert collect().argv == sys.argv
    assert datetime.fromisoformat(collect().started_at).tzinfo is not None  # UTC, with its offset
    assert Provenance.model_validate(json.loads(json.dumps(doc))) == p


@pytest.mark.skipif(not HAS_GIT or not _is_checkout(ROOT), reason="needs git and the project as a git checkout")
def test_the_commit_is_the_checkout_s_head_whatever_the_working_directory(tmp_path, monkeypatch):
    head = _git(ROOT, "rev-parse", "HEAD")
    dirty = bool(_git(ROOT, "status", "--porcelain", "--untracked-files=no"))
    assert source_revision() == (head, dirty)
    other = _repo(tmp_path / "elsewhere")  # the user's own repository: not the project's commit
    monkeypatch.chdir(other)
    p = collect()
    assert (p.commit, p.dirty) == (head, dirty) and re.fullmatch(r"[0-9a-f]{40}", p.commit)


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_dirty_and_the_changes_digest_follow_tracked_files_only(tmp_path):
    a, b = _repo(tmp_path / "a"), _repo(tmp_path / "b")
    commit = _git(a, "rev-parse", "HEAD")
    assert source_revision(a) == (commit, False)
    (a / "untracked").write_text("x")  # as git describe --dirty: untracked files do not count
    assert source_revision(a) == (commit, False)
    clean = changes_digest(a)
    (a / "f").write_text("changed\n")
    assert source_revision(a) == (commit, True)
    assert changes_digest(a) != clean
    (b / "f").write_text("changed\n")  # the same change on another checkout of the same content
    assert changes_digest(b) == changes_digest(a)


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_the_code_digest_follows_the_runtime_packages_and_the_inputs_only(tmp_path):
    for pkg in RUNTIME_PACKAGES + ("analysis",):
        (tmp_path / pkg / "__pycache__").mkdir(parents=True)
        (tmp_path / pkg / "mod.py").write_text(f"# {pkg}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: a\n")
    first = code_digest([spec], tmp_path)
    assert re.fullmatch(r"[0-9a-f]{64}", first) and code_digest([spec], tmp_path) == first
    (tmp_path / "analysis" / "mod.py").write_text("# the analysis reads finished runs\n")
    (tmp_path / "traffic" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"compiled")
    assert code_digest([spec], tmp_path) == first
    (tmp_path / "traffic" / "mod.py").write_text("# changed\n")
    changed = code_digest([spec], tmp_path)
    assert changed != first
    spec.write_text("name: b\n")
    assert code_digest([spec], tmp_path) not in (first, changed) and code_digest([], tmp_path) != changed
    with pytest.raises(OSError):
        code_digest([tmp_path / "missing.json"], tmp_path)


def test_no_checkout_or_no_git_gives_none_not_an_error(tmp_path, monkeypatch):
    assert source_revision(tmp_path) == (None, None)  # not a checkout
    repo = _repo(tmp_path / "repo")
    (repo / "pkg").mkdir()
    assert source_revision(repo / "pkg") == (None, None)  # inside another repository's tree: not its commit
    assert changes_digest(repo / "pkg") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert source_revision(empty) == (None, None)  # a checkout without a commit
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no git at all
    assert source_revision(repo) == (None, None)
    p = collect()
    assert p.commit is None and p.dirty is None and p.python == platform.python_version()


# ----------------------------------------------------------------------------- in the run directory


def test_write_provenance_writes_the_file_the_summary_reads(tmp_path):
    prov = rundir.write_provenance(tmp_path)
    assert json.loads((tmp_path / PROVENANCE_FILE).read_text()) == prov.dump()


def test_a_run_s_spec_yaml_is_headed_by_its_provenance_and_still_loads_the_same(tmp_path):
    exp = from_dict(
        {
            "name": "prov",
            "topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 2},
            "workload": {"scheme": "allreduce", "iterations": 2},
        }
    )
    prov = collect(argv=["testbed", "run", "a b.yaml", "--set", "x: y # not a comment"])
    path = tmp_path / "spec.yaml"
    write_spec(path, exp, prov)
    text = path.read_text()
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert head and text.startswith("# provenance:") and text.endswith(dump_spec(exp))
    assert yaml.safe_load("\n".join(line[2:] for line in head))["provenance"] == prov.dump()
    assert yaml.safe_load(text) == exp.to_dict()
    again = load_spec(path)  # testbed run runs/<id>/spec.yaml: the same experiment
    assert again.to_dict() == exp.to_dict()


def test_a_run_records_its_provenance_first_and_its_summary_carries_it(tmp_path):
    """A loopback run starts as the harness's does (provenance.json, then spec.yaml headed by
    it); the summary the harness computes from the run directory carries it."""
    from analysis.metrics import summarize
    from testbed.loopback import run_local

    exp = from_dict(
        {
            "workload": {
                "scheme": "allreduce",
                "model": "digits_mlp",
                "iterations": 2,
                "workers": 2,
                "warmup_iterations": 0,
                "compute": {"mode": "emulated", "profile": "zero"},
            },
            "topology": {"kind": "rack", "hosts_per_rack": 2},
        }
    )
    run_dir = run_local(exp, tmp_path / "run")
    prov = Provenance.model_validate_json((run_dir / PROVENANCE_FILE).read_text())
    assert prov.argv == sys.argv and prov.python == platform.python_version()
    assert (run_dir / "spec.yaml").read_text().startswith(prov.comment())
    assert summarize(run_dir).provenance == prov


# ----------------------------------------------------------------------------- testbed check --cluster

HEAD = "a" * 40
OTHER = "b" * 40


@pytest.mark.parametrize(
    "there, here, same, says",
    [
        (Source("0.2.0", HEAD, False), Source("0.2.0", HEAD, False), True, "commit aaaaaaaaaaaa"),
        (Source("0.2.0", OTHER, False), Source("0.2.0", HEAD, False), False, "another commit"),
        (Source("0.2.0", HEAD, True, "d1"), Source("0.2.0", HEAD, False), False, "uncommitted changes there only"),
        (Source("0.2.0", HEAD, False), Source("0.2.0", HEAD, True, "d1"), False, "uncommitted changes here only"),
        (Source("0.2.0", HEAD, True, "d1"), Source("0.2.0", HEAD, True, "d2"), False, "other uncommitted changes"),
        (Source("0.2.0", HEAD, True, "d1"), Source("0.2.0", HEAD, True, "d1"), True, "the same as here"),
        (Source("0.2.0", HEAD, True, None), Source("0.2.0", HEAD, True, None), False, "other uncommitted changes"),
        (Source("0.2.0"), Source("0.2.0", HEAD, False), False, "cannot be compared"),
        (Source("0.1.0"), Source("0.2.0"), False, "here: version 0.2.0"),
        (Source("0.2.0"), Source("0.2.0"), True, "version 0.2.0 (no git checkout)"),
    ],
)
def test_compare_source(there, here, same, says):
    ok, detail = compare_source(there, here)
    assert ok is same and says in detail, detail


class FakeMachine(Machine):
    """A machine whose SSH answers are given: ``id -u`` says root, the project's probe says
    ``probe`` (None: it fails as a missing project does), every other command succeeds."""

    def __init__(self, addr: str, probe: dict | None):
        super().__init__(addr)
        object.__setattr__(self, "probe", probe)

    def run(self, command, timeout_s=20, input=None):
        return subprocess.CompletedProcess([], 0, "0\n" if command == "id -u" else "", "")

    def python(self, project_dir, code, query=None, timeout_s=120):
        if self.probe is None:
            raise RuntimeError("ModuleNotFoundError: No module named 'testbed'")
        assert "source_revision" in code and "changes_digest" in code
        return self.probe


@pytest.fixture
def no_network(monkeypatch):
    """No clock exchange and no ping: the fake machines answer only over ``run`` and ``python``."""
    monkeypatch.setattr(cluster, "clock_offset", lambda m: (0.0, 0.001))
    monkeypatch.setattr(cluster, "_largest_unfragmented", lambda addr: 1500)


def _probe(**kw) -> dict:
    return {
        "version": "0.2.0",
        "commit": HEAD,
        "dirty": False,
        "changes": None,
        "qdiscs": {"htb": True},
        "tools": {"mnexec": "/usr/bin/mnexec", "bwm-ng": "/usr/bin/bwm-ng"},
        **kw,
    }


def test_check_machine_names_the_machine_whose_code_differs(no_network):
    here = Source("0.2.0", HEAD, False)
    items = {
        m: check_machine(FakeMachine(m, probe), "/srv/netbed", here)
        for m, probe in (
            ("10.0.0.1", _probe()),
            ("10.0.0.2", _probe(commit=OTHER)),
            ("10.0.0.3", _probe(dirty=True, changes="x")),
            ("10.0.0.4", {k: v for k, v in _probe().items() if k not in ("commit", "dirty", "changes")}),
        )
    }
    project = {m: next(i for i in its if i.name == f"{m}: project") for m, its in items.items()}
    assert project["10.0.0.1"].ok and project["10.0.0.1"].detail == "commit aaaaaaaaaaaa at /srv/netbed"
    assert all(i.ok for i in items["10.0.0.1"]), [(i.name, i.detail) for i in items["10.0.0.1"] if not i.ok]
    bad = {m for m, i in project.items() if not i.ok}
    assert bad == {"10.0.0.2", "10.0.0.3", "10.0.0.4"}
    assert "commit bbbbbbbbbbbb; here: commit aaaaaaaaaaaa: another commit" in project["10.0.0.2"].detail
    assert "uncommitted changes there only" in project["10.0.0.3"].detail
    assert "no git checkout" in project["10.0.0.4"].detail  # a copy that reports no commit
    assert "check out commit aaaaaaaaaaaa there" in project["10.0.0.2"].remedy
    missing = check_machine(FakeMachine("10.0.0.5", None), "/srv/netbed", here)
    assert not next(i for i in missing if i.name == "10.0.0.5: project").ok


def test_check_cluster_compares_every_machine_with_this_one(no_network, monkeypatch):
    from testbed.spec import ClusterSpec

    here = Source.here()
    answers = {
        "10.0.0.1": _probe(commit=here.commit, dirty=here.dirty, changes=here.changes),
        "10.0.0.2": _probe(commit=OTHER),
    }
    monkeypatch.setattr(
        cluster.Machine, "of", classmethod(lambda cls, spec: [FakeMachine(m, answers[m]) for m in spec.machines])
    )
    items = cluster.check_cluster(ClusterSpec.model_validate({"machines": list(answers)}))
    project = {i.name: i for i in items if i.name.endswith(": project")}
    assert not project["10.0.0.2: project"].ok
    assert project["10.0.0.1: project"].ok is (here.commit is not None)  # without a checkout here: not comparable
