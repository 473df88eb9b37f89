"""The documentation: the committed spec reference is what the generator prints."""
from pathlib import Path

from testbed import spec_docs
from testbed.spec import Experiment

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_spec_reference_is_the_generators_output():
    assert (ROOT / "docs" / "spec.md").read_text() == spec_docs.spec_reference(), \
        f"docs/spec.md is out of date: run {spec_docs.COMMAND}"


def test_the_spec_reference_lists_every_field_of_every_section():
    text = spec_docs.spec_reference()
    for path, model in spec_docs._sections(Experiment, ""):
        section = text.split(f"\n## {path or 'Top level'}\n", 1)[1].split("\n## ", 1)[0]
        for name in model.model_fields:
            assert f"- **`{name}`**:" in section, (path, name)
    for name, cls in spec_docs.shipped_schemes():
        assert f"\n### `{name}`\n" in text
    assert {"ps", "allreduce", "p3", "phub", "ibatch", "stanza", "pipe_sgd"} <= {n for n, _ in spec_docs.shipped_schemes()}


def test_the_module_prints_the_reference(capsys):
    assert spec_docs.main() == 0
    assert capsys.readouterr().out == spec_docs.spec_reference()
