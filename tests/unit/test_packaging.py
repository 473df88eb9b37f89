"""How the project is distributed and set up: the licence and the package metadata, the
Vagrant VM's Vagrantfile, and where scripts/setup.sh takes torch from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_licence_and_readme_are_declared():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Copyright (c) 2026, the dl-netbed authors" in text
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    assert project["readme"] == "README.md" and (ROOT / "README.md").is_file()
    # setuptools refuses a licence classifier beside an SPDX licence expression
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


def test_build_backend_takes_the_licence_expression():
    """The SPDX string form of ``license`` needs setuptools 77 (PEP 639): the build requires it."""
    (req,) = [Requirement(r) for r in _pyproject()["build-system"]["requires"] if Requirement(r).name == "setuptools"]
    assert not req.specifier.contains("76.3") and req.specifier.contains("77.0")


def test_metadata_builds(tmp_path):
    """The installed setuptools writes the licence, the readme and the keywords into METADATA."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    out = tmp_path / "out"
    out.mkdir()
    code = "import sys, setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    r = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    meta = (out / r.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: BSD-3-Clause" in meta
    assert "License-File: LICENSE" in meta
    assert "Description-Content-Type: text/markdown" in meta
    assert "Keywords: " in meta


# --- the Vagrant VM -----------------------------------------------------------------------

needs_vagrant = pytest.mark.skipif(
    shutil.which("vagrant") is None, reason="vagrant is not installed (apt-get install vagrant)"
)


def _validate(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``vagrant validate --ignore-provider`` of a copy of the Vagrantfile, with its own
    VAGRANT_HOME (no box or provider needed; nothing written in the repository)."""
    shutil.copy(ROOT / "Vagrantfile", tmp_path / "Vagrantfile")
    full = {k: v for k, v in os.environ.items() if not k.startswith("TESTBED_VM_")}
    full.update(VAGRANT_HOME=str(tmp_path / "vagrant.d"), VAGRANT_CHECKPOINT_DISABLE="1", **env)
    return subprocess.run(
        ["vagrant", "validate", "--ignore-provider"],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_vagrant
def test_vagrantfile_validates(tmp_path):
    r = _validate(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _validate(tmp_path, TESTBED_VM_CPUS="8", TESTBED_VM_MEMORY_MB="16384")
    assert r.returncode == 0, r.stdout + r.stderr


@needs_vagrant
@pytest.mark.parametrize("name, value", [("TESTBED_VM_CPUS", "four"), ("TESTBED_VM_MEMORY_MB", "1024")])
def test_vagrantfile_refuses_bad_resources(tmp_path, name, value):
    r = _validate(tmp_path, **{name: value})
    assert r.returncode == 2
    assert f'{name}="{value}" is not allowed: a whole number' in r.stderr


# --- where setup.sh takes torch from ------------------------------------------------------


def _torch_source(script: Path = SETUP, path: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """``bash setup.sh --torch-source``: prints the choice, installs nothing, needs no root."""
    full = {k: v for k, v in os.environ.items() if k != "TESTBED_TORCH_INDEX"}
    if path is not None:
        full["PATH"] = path
    full.update(env)
    return subprocess.run(
        ["bash", str(script), "--torch-source"], env=full, capture_output=True, text=True, timeout=120
    )


def test_setup_script_parses():
    assert subprocess.run(["bash", "-n", str(SETUP)]).returncode == 0


def test_torch_index_from_the_environment():
    r = _torch_source(TESTBED_TORCH_INDEX=CPU_INDEX)
    assert r.returncode == 0 and r.stdout == f"torch==2.13.0 from {CPU_INDEX} (TESTBED_TORCH_INDEX)\n"
    r = _torch_source(TESTBED_TORCH_INDEX="pip")
    assert r.returncode == 0 and "from pip's configuration" in r.stdout


@pytest.mark.parametrize("value", ["download.pytorch.org/whl/cpu", "cpu"])
def test_torch_index_refuses_what_is_not_a_url(value):
    r = _torch_source(TESTBED_TORCH_INDEX=value)
    assert r.returncode == 2 and f"TESTBED_TORCH_INDEX={value} is not allowed" in r.stderr


def test_setup_refuses_an_unknown_argument():
    r = subprocess.run(["bash", str(SETUP), "--nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown argument '--nope'" in r.stderr


def test_torch_stays_with_pip_where_it_is_found_without_an_index():
    """This checkout's .venv holds torch==2.13.0 (the tests import it): pip's configuration
    stays in charge, as it was before the index choice existed."""
    r = _torch_source()
    assert r.returncode == 0 and "from pip's configuration (it finds torch==2.13.0 without an index)" in r.stdout


def _copy_with_stub_pip(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of setup.sh whose .venv pip finds nothing without an index, and a bin directory."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "setup.sh"
    shutil.copy(SETUP, script)
    pip = tmp_path / ".venv" / "bin" / "pip"
    pip.parent.mkdir(parents=True)
    pip.write_text("#!/bin/sh\nexit 1\n")
    pip.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return script, bin_dir


def test_torch_from_the_cpu_index_without_a_local_wheel_or_gpu(tmp_path):
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA GPU")
    script, bin_dir = _copy_with_stub_pip(tmp_path)
    r = _torch_source(script, path=f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0 and r.stdout == f"torch==2.13.0 from {CPU_INDEX} (no local wheel, no NVIDIA GPU)\n"


def test_torch_from_pip_with_a_gpu(tmp_path):
    script, bin_dir = _copy_with_stub_pip(tmp_path)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    r = _torch_source(script, path=f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0 and "from pip's configuration (an NVIDIA GPU: PyPI's CUDA build)" in r.stdout
