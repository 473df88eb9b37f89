"""The command line's conventions: --version and ``python -m testbed``, shell completion, "did
you mean", YAML errors that name the file and line, the same exit status from every command,
``show`` as a table or one JSON document, launchers refused in a program's command, the spec's
JSON Schema, and progress without a terminal. Nothing here builds a network."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import RunFailed, SpecError
from common.provenance import source_revision
from testbed import cli, progress
from testbed.check import Item
from testbed.schema import MODELINE, SCHEMA_FILE, field_paths, modeline, schema_text
from testbed.spec import from_dict, load_spec
from testbed.version import describe
from traffic import rundir
from traffic.launchers import launcher_of, unwrap
from traffic.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "experiments").glob("*.yaml"))


def run_cli(*argv) -> tuple[int, str, str]:
    """``testbed.cli.main(argv)`` here: (exit status, stdout, stderr); argparse's exits give their status."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def make_run(parent: Path, name: str, summary: dict | None = None, events: bool = False) -> Path:
    """A run directory as the harness leaves it: spec.yaml, processes.json and (given) summary.json."""
    d = rundir.create(parent, name)
    (d / "spec.yaml").write_text("name: x\n")
    (d / "processes.json").write_text(json.dumps({"processes": []}))
    if summary is not None:
        RunSummary.model_validate(summary).write(d)
    if events:
        (d / "events" / "worker0.jsonl").write_text(
            json.dumps(
                {
                    "proc": "worker0",
                    "role": "worker",
                    "rank": 0,
                    "kind": "iteration",
                    "ts": 10.0,
                    "dur": 0.5,
                    "iteration": 0,
                }
            )
            + "\n"
        )
    return d


OK = {
    "status": "ok",
    "run_id": "r",
    "scheme": "ps",
    "scale": 2.0,
    "throughput": {"mean": 123.456},
    "iteration_time_s": {"mean": 0.25},
    "bytes": {"core": 12_340_000},
}
FAILED = {
    "status": "failed",
    "scheme": "allreduce",
    "scale": 1.0,
    "error": "process worker0 exited with code 1\nTraceback ...",
}


# ---------------------------------------------------------------- --version, python -m testbed


def test_version_names_the_package_and_the_commit_of_a_checkout(tmp_path):
    rc, out, _ = run_cli("--version")
    assert rc == 0 and out.strip() == describe() and out.startswith("dl-netbed ")
    if (ROOT / ".git").exists():
        assert "(git " in out
    assert source_revision(tmp_path) == (None, None)  # not a checkout: the version alone


def test_python_dash_m_testbed_is_the_command():
    out = subprocess.run(
        [sys.executable, "-m", "testbed", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0 and out.stdout.startswith("dl-netbed ")


# ---------------------------------------------------------------- shell completion


def test_completion_prints_the_shell_code():
    rc, out, _ = run_cli("completion", "--shell", "bash")
    assert rc == 0 and "testbed" in out and "complete" in out
    rc, out, _ = run_cli("completion", "--shell", "zsh")
    assert rc == 0 and "testbed" in out


def complete(line: str) -> list[str]:
    """What the shell's completion hook gets for the command line ``line`` (the cursor at its
    end): ``python -m testbed`` run as the hook runs it, completions on file descriptor 8."""
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n"}
    out = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m testbed 8>&1 9>/dev/null >/dev/null 2>&1'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    return out.stdout.split("\n")


def test_completion_of_commands_and_of_set_paths():
    assert {"run", "show", "schema", "completion"} <= set(complete("testbed "))
    offered = complete("testbed run --set workload.sch")
    assert "workload.scheme=" in offered
    assert {"topology.kind", "workload.program.command", "run.timeout_s"} <= set(field_paths())


# ---------------------------------------------------------------- did you mean


@pytest.mark.parametrize(
    "override, field, hint",
    [
        ("workload.scheme=allreduc", "workload.scheme", "'allreduce'"),
        ("workload.shceme=ps", "workload.shceme", "'workload.scheme'"),
        ("worklaod.iterations=3", "worklaod", "'workload'"),
        ("topology.kind=rak", "topology.kind", "'rack'"),
        ("workload.model=digits_mpl", "workload.model", "'digits_mlp'"),
        ("workload.options.overlpa=true", "workload.options.overlpa", "'workload.options.overlap'"),
    ],
)
def test_a_near_miss_is_answered_with_the_closest_name(override, field, hint):
    with pytest.raises(SpecError) as e:
        from_dict({}, [override])
    assert e.value.field == field and f"did you mean {hint}?" in str(e.value)


def test_the_cli_says_did_you_mean(tmp_path):
    rc, _, err = run_cli(
        "run",
        "--dry-run",
        ROOT / "experiments" / "quickstart.yaml",
        "--set",
        "workload.scheme=allreduc",
        "--runs-dir",
        tmp_path / "runs",
    )
    assert rc == 2 and "did you mean 'allreduce'?" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_nothing_close_suggests_nothing():
    with pytest.raises(SpecError) as e:
        from_dict({}, ["workload.scheme=zzzzzz"])
    assert "did you mean" not in str(e.value)


# ---------------------------------------------------------------- YAML errors name the file and line


def test_a_yaml_error_names_the_file_line_and_column(tmp_path):
    spec = tmp_path / "x.yaml"
    spec.write_text("name: x\nworkload:\n  scheme: ps\n   iterations: 3\n")
    rc, _, err = run_cli("run", "--dry-run", spec)
    assert rc == 2
    assert f"testbed: error: {spec}, line 4, column 14: " in err, err
    assert "<unicode string>" not in err and "iterations: 3" not in err  # no line of the file echoed
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert e.value.field == "<file>" and str(e.value).startswith(f"{spec}, line 4, column 14: ")


# ---------------------------------------------------------------- exit status: 0 ok, 1 a run failed, 2 usage


def test_ls_exit_status(tmp_path, monkeypatch):
    assert run_cli("ls", tmp_path / "missing")[0] == 2
    (tmp_path / "f").write_text("x")
    rc, _, err = run_cli("ls", tmp_path / "f")
    assert rc == 2 and "not a directory" in err
    rc, out, _ = run_cli("ls", tmp_path)
    assert rc == 0 and "no runs under" in out
    monkeypatch.chdir(tmp_path)  # no runs/ here: nothing has run yet, which is no error
    assert run_cli("ls")[0] == 0
    make_run(tmp_path / "runs", "r", OK)
    rc, out, _ = run_cli("ls")
    assert rc == 0 and out.split()[:2] == ["r", "ok"]


@pytest.mark.parametrize("command", [["show"], ["plot"], ["timeline"], ["flows"], ["report", "p3"]])
def test_a_missing_run_is_a_usage_error(tmp_path, command):
    rc, _, err = run_cli(*command, tmp_path / "missing")
    assert rc == 2 and err.startswith("testbed: error: ")


def test_timeline_of_a_run_without_events_refuses(tmp_path):
    d = make_run(tmp_path, "r", OK)
    rc, out, err = run_cli("timeline", d)
    assert rc == 2 and "has no events" in err and not (d / "timeline.json").exists()
    with_events = make_run(tmp_path, "e", OK, events=True)
    rc, out, _ = run_cli("timeline", with_events)
    assert rc == 0 and (with_events / "timeline.json").is_file()


def test_plot_of_a_run_with_nothing_to_draw_refuses(tmp_path):
    d = make_run(tmp_path, "r", OK)
    rc, _, err = run_cli("plot", d)
    assert rc == 2 and "nothing to plot" in err


def test_run_exit_status_follows_the_runs(tmp_path, monkeypatch):
    import testbed.runner
    from testbed.runner import RunResult

    spec = ROOT / "experiments" / "quickstart.yaml"
    results = {"ok": [RunResult(tmp_path, OK)], "failed": [RunResult(tmp_path, OK), RunResult(tmp_path, FAILED)]}
    for outcome, expected in (("ok", 0), ("failed", 1)):
        monkeypatch.setattr(testbed.runner, "run_experiment", lambda exp, **kw: results[outcome])
        assert run_cli("run", spec, "-q")[0] == expected

    def raises(exp, **kw):
        raise RunFailed("process worker0 exited with code 1")

    monkeypatch.setattr(testbed.runner, "run_experiment", raises)
    rc, _, err = run_cli("run", spec, "-q")
    assert rc == 1 and "worker0 exited" in err

    def interrupted(exp, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(testbed.runner, "run_experiment", interrupted)
    assert run_cli("run", spec, "-q")[0] == 130
    assert run_cli("run", "--dry-run", spec, "--runs-dir", tmp_path / "runs")[0] == 0
    assert run_cli("run", "--dry-run", tmp_path / "missing.yaml")[0] == 2
    assert run_cli("run", "--dry-run", spec, "--set", "nonsense")[0] == 2


def test_the_other_commands_exit_status(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "run_checks", lambda: [Item("root", True, "")])
    assert run_cli("check")[0] == 0
    monkeypatch.setattr(cli, "run_checks", lambda: [Item("root", False, "not root")])
    assert run_cli("check")[0] == 1
    monkeypatch.setattr(cli, "clean", lambda force: [])
    assert run_cli("clean")[0] == 0
    rc, _, err = run_cli("report", "stanaz", tmp_path)
    assert rc == 2 and "did you mean 'stanza'?" in err
    assert run_cli("reproduce", "p3.fig99")[0] == 2
    assert run_cli("reproduce", "--list")[0] == 0
    assert run_cli("schema")[0] == 0
    assert run_cli()[0] == 2  # no command: argparse's usage
    assert run_cli("nonsense")[0] == 2


# ---------------------------------------------------------------- show: a table, or one JSON document


def test_show_prints_a_table_of_one_run_and_its_json(tmp_path):
    d = make_run(tmp_path, "r", OK)
    rc, out, _ = run_cli("show", d)
    assert rc == 0
    header, _, row = out.splitlines()[:3]
    assert header.split() == ["run", "status", "scheme", "scale", "samples/s", "iteration", "ms", "core", "MB"]
    assert row.split() == ["r", "ok", "ps", "2", "123.5", "250.0", "12.34"]
    rc, out, _ = run_cli("show", d, "--json")
    assert rc == 0 and json.loads(out) == RunSummary.model_validate(OK).dump()


def test_show_of_a_sweep_has_a_row_per_run_and_one_json_document(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("{}")
    make_run(sweep, "000_scheme=ps", OK)
    make_run(sweep, "001_scheme=allreduce", FAILED)
    (make_run(sweep, "002_scheme=p3") / "logs" / "harness.log").write_text("")  # its runner died
    rc, out, _ = run_cli("show", sweep)
    lines = out.splitlines()
    assert rc == 0 and [ln.split()[:2] for ln in lines[2:5]] == [
        ["000_scheme=ps", "ok"],
        ["001_scheme=allreduce", "failed"],
        ["002_scheme=p3", "killed"],
    ]
    assert lines[-1] == "001_scheme=allreduce: process worker0 exited with code 1"
    rc, out, _ = run_cli("show", sweep, "--json")
    doc = json.loads(out)  # one document, not several back to back
    assert rc == 0 and list(doc) == ["000_scheme=ps", "001_scheme=allreduce", "002_scheme=p3"]
    assert doc["001_scheme=allreduce"]["status"] == "failed" and doc["002_scheme=p3"] == {"status": "killed"}


# ---------------------------------------------------------------- launchers in a program's command


@pytest.mark.parametrize(
    "command, instead, per_host",
    [
        (["torchrun", "--nproc_per_node=2", "train.py", "--epochs", "1"], ["python", "train.py", "--epochs", "1"], 2),
        (
            ["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "-m", "pkg.train", "--lr", "0.1"],
            ["python", "-m", "pkg.train", "--lr", "0.1"],
            4,
        ),
        (["python", "-m", "torch.distributed.run", "--standalone", "train.py"], ["python", "train.py"], 1),
        (["python3", "-m", "torch.distributed.launch", "--no-python", "./train.sh", "x"], ["./train.sh", "x"], 1),
        (["/usr/bin/torchrun", "--nproc_per_node", "gpu", "train.py"], ["python", "train.py"], None),
        (
            ["accelerate", "launch", "--num_processes", "2", "--multi_gpu", "train.py", "--lr", "1"],
            ["python", "train.py", "--lr", "1"],
            None,
        ),
    ],
)
def test_a_launcher_is_unwrapped_to_the_command_it_would_run(command, instead, per_host):
    assert launcher_of(command) is not None
    assert unwrap(command) == (instead, per_host)


def test_commands_without_a_launcher_pass():
    for command in (["python", "train.py"], ["python", "-m", "pkg.train"], ["torchrunner"], ["accelerate", "config"]):
        assert launcher_of(command) is None and unwrap(command) == (None, None)


def test_a_launcher_in_workload_program_is_refused_with_the_command_to_give():
    with pytest.raises(SpecError) as e:
        from_dict(
            {"workload": {"program": {"command": ["torchrun", "--nproc_per_node=2", "train.py", "--epochs", "1"]}}}
        )
    msg = str(e.value)
    assert e.value.field == "workload.program.command"
    assert "python train.py --epochs 1" in msg and "workload.program.processes_per_host: 2" in msg
    assert "MASTER_ADDR" in msg and "RANK" in msg


def test_the_cli_refuses_a_launcher_as_program(tmp_path):
    rc, _, err = run_cli(
        "run",
        "--dry-run",
        "--program",
        "torchrun --nproc-per-node 2 train.py --epochs 1",
        "--runs-dir",
        tmp_path / "runs",
    )
    assert rc == 2 and "without a distributed launcher" in err and "python train.py --epochs 1" in err
    assert "--set workload.program.processes_per_host=2" in err and "Traceback" not in err


# ---------------------------------------------------------------- the spec's JSON Schema


def test_the_committed_schema_is_what_testbed_schema_prints():
    rc, out, _ = run_cli("schema")
    assert rc == 0 and out == schema_text() == SCHEMA_FILE.read_text(), (
        "regenerate it: .venv/bin/python -m testbed schema > testbed/data/spec.schema.json"
    )
    schema = json.loads(out)
    assert {"topology", "workload", "run", "sweep"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False  # an unknown section is marked as the testbed refuses it


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_shipped_spec_names_the_schema_and_still_loads(path):
    first = path.read_text().splitlines()[0]
    assert first == modeline(path) == f"{MODELINE}../testbed/data/spec.schema.json"
    assert (path.parent / first.removeprefix(MODELINE)).resolve() == SCHEMA_FILE.resolve()
    load_spec(path)


# ---------------------------------------------------------------- progress without a terminal


def write_iterations(path, proc, ends, samples=32):
    with open(path, "a") as f:
        for i, end in enumerate(ends):
            f.write(
                json.dumps(
                    {"proc": proc, "kind": "iteration", "ts": end - 0.5, "dur": 0.5, "iteration": i, "samples": samples}
                )
                + "\n"
            )


def test_without_a_terminal_progress_is_plain_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "LINE_PERIOD_S", 0.0)
    (tmp_path / "events").mkdir()
    p = progress.RunProgress(True, "run1", iterations=20)
    p.terminal = False  # as under nohup, tee or CI
    p.phase("building network")
    p.training(tmp_path, ["worker0"], {})
    p.poll()  # nothing done yet: no line
    write_iterations(tmp_path / "events" / "worker0.jsonl", "worker0", [10, 11, 12])
    p._next_poll = 0.0
    p.poll()
    p.close()
    assert capsys.readouterr().err.splitlines() == [
        "testbed: run1: building network",
        "testbed: run1: training (20 iterations)",
        "testbed: run1: iteration 3/20, 32.0 samples/s",
    ]  # 32 samples an iteration, one a second
    assert p.bar is None
    quiet = progress.RunProgress(False, "run1", iterations=20)
    quiet.terminal = False
    quiet.phase("building network")
    assert capsys.readouterr().err == ""


def test_a_sweep_without_a_terminal_says_each_point(capsys):
    s = progress.SweepProgress(True, "sweep1", 2)
    s.terminal = False
    s.start(0, "scheme=ps")
    s.end("runs/sweep1/000_scheme=ps: ok")
    s.start(1, "scheme=allreduce")
    s.close()
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        "testbed: sweep sweep1: point 1/2: scheme=ps",
        "testbed: sweep sweep1: point 2/2: scheme=allreduce",
    ]
    assert out.out.splitlines() == ["runs/sweep1/000_scheme=ps: ok"]


def test_verbose_run_streams_the_harness_log(tmp_path, monkeypatch):
    import testbed.runner
    from testbed.runner import RunResult

    def run(exp, **kw):
        logging.getLogger("testbed.network").warning("network up in 1.0 s")  # a module's logger of the harness
        return [RunResult(tmp_path, OK)]

    monkeypatch.setattr(testbed.runner, "run_experiment", run)
    spec = ROOT / "experiments" / "quickstart.yaml"
    rc, _, err = run_cli("run", spec, "-q", "-v")
    assert rc == 0 and "testbed: WARNING network up in 1.0 s" in err
    rc, _, err = run_cli("run", spec, "-q")
    assert rc == 0 and "network up" not in err
    assert not [h for h in logging.getLogger("testbed").handlers if isinstance(h, progress._TqdmStderr)]
