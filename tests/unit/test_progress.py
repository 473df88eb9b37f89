"""The live display of a run: phases, global iterations and samples/s from the events."""

import json

from testbed.progress import RunProgress


def write_iterations(path, proc, ends, samples=32):
    with open(path, "a") as f:
        for i, end in enumerate(ends):
            f.write(
                json.dumps(
                    {"proc": proc, "kind": "iteration", "ts": end - 0.5, "dur": 0.5, "iteration": i, "samples": samples}
                )
                + "\n"
            )


def test_global_iterations_and_samples_per_s_in_emulated_time(tmp_path):
    (tmp_path / "events").mkdir()
    p = RunProgress(True, "run", iterations=20, scale=2.0)
    p.terminal = True  # the bar (stderr is not a terminal under pytest)
    p.phase("building network")
    p.training(tmp_path, ["worker0", "worker1"], {"switches": [{"name": "tor1"}], "links": []})
    write_iterations(tmp_path / "events" / "worker0.jsonl", "worker0", [10, 12, 14, 16])
    write_iterations(tmp_path / "events" / "worker1.jsonl", "worker1", [10.5, 12.5, 14.5])
    with open(tmp_path / "events" / "worker1.jsonl", "a") as f:
        f.write('{"proc": "worker1", "kind": "itera')  # a line being written: not read yet
    p.poll()
    assert p.bar.n == 3  # the fewest any worker finished
    # as the summary counts throughput: iteration 1 completes at 12.5 s (worker1's end), 2 s
    # after iteration 0 (10.5 s): 2 real s = 1 emulated s for 2 x 32 samples; iteration 2 the same
    assert "64.0 samples/s" in p.bar.postfix
    p.close()


def test_disabled_display_does_nothing(tmp_path):
    p = RunProgress(False, "run", iterations=5)
    p.phase("building network")
    p.training(tmp_path, ["worker0"], {})
    p.poll()
    assert p.bar is None
