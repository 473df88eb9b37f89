"""A run's provenance (:mod:`common.provenance`): what it records, that the commit is the
project's own (git run in the package's directory, never the caller's), None instead of an
error without git or a checkout, the comment block of a run's ``spec.yaml`` (which still loads
and runs as without it) and the record a run and its summary carry."""
from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from common import provenance
from common.provenance import PROVENANCE_FILE, Provenance, changes_digest, collect, source_revision
from testbed.spec import dump_spec, from_dict, load_spec, write_spec
from traffic import rundir

ROOT = Path(__file__).resolve().parents[1]
HAS_GIT = shutil.which("git") is not None


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", f"safe.directory={cwd}", "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _repo(path: Path, text: str = "a\n") -> Path:
    """A git repository at ``path`` with one committed file ``f``."""
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    (path / "f").write_text(text)
    _git(path, "add", "f")
    _git(path, "commit", "-q", "-m", "one")
    return path


def _is_checkout(path: Path) -> bool:
    r = subprocess.run(["git", "-c", f"safe.directory={path}", "rev-parse", "--show-toplevel"], cwd=path,
                       capture_output=True, text=True)
    return r.returncode == 0 and Path(r.stdout.strip()).resolve() == path.resolve()


# ----------------------------------------------------------------------------- the record


def test_collect_records_every_field():
    when = datetime(2026, 11, 23, 4, 25, 36, tzinfo=timezone.utc)
    p = collect(argv=["testbed", "run", "spec.yaml"], started_at=when)
    doc = p.dump()
    assert set(doc) >= {"project_version", "commit", "dirty", "python", "torch", "mininet", "kernel", "machine",
                        "started_at", "argv"}
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
    exp = from_dict({"name": "prov", "topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 2},
                     "workload": {"scheme": "allreduce", "iterations": 2}})
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
    exp = from_dict({"workload": {"scheme": "allreduce", "model": "digits_mlp", "iterations": 2, "workers": 2,
                                  "warmup_iterations": 0, "compute": {"mode": "emulated", "profile": "zero"}},
                     "topology": {"kind": "rack", "hosts_per_rack": 2}})
    run_dir = run_local(exp, tmp_path / "run")
    prov = Provenance.model_validate_json((run_dir / PROVENANCE_FILE).read_text())
    assert prov.argv == sys.argv and prov.python == platform.python_version()
    assert (run_dir / "spec.yaml").read_text().startswith(prov.comment())
    assert summarize(run_dir).provenance == prov
