"""The documentation: the committed spec reference is what the generator prints, and every
relative link of README.md and docs/*.md points to an existing file (and heading)."""

import re
from pathlib import Path

import pytest

from testbed import spec_docs
from testbed.spec import Experiment

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")  # [text](target), text may hold [x]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link or heading inside one is none)."""
    return FENCE.sub("", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of the headings of ``page``: lowercase, punctuation but ``-`` and
    ``_`` dropped, spaces as ``-``; a repeated one gets ``-1``, ``-2``, ..."""
    out, seen = set(), {}
    for m in re.finditer(r"^#{1,6} +(.+?) *$", _prose(page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_committed_spec_reference_is_the_generators_output():
    assert (ROOT / "docs" / "spec.md").read_text() == spec_docs.spec_reference(), (
        f"docs/spec.md is out of date: run {spec_docs.COMMAND}"
    )


def test_the_spec_reference_lists_every_field_of_every_section():
    text = spec_docs.spec_reference()
    for path, model in spec_docs._sections(Experiment, ""):
        section = text.split(f"\n## {path or 'Top level'}\n", 1)[1].split("\n## ", 1)[0]
        for name in model.model_fields:
            assert f"- **`{name}`**:" in section, (path, name)
    for name, _cls in spec_docs.shipped_schemes():
        assert f"\n### `{name}`\n" in text
    assert {"ps", "allreduce", "p3", "phub", "ibatch", "stanza", "pipe_sgd"} <= {
        n for n, _ in spec_docs.shipped_schemes()
    }


def test_the_module_prints_the_reference(capsys):
    assert spec_docs.main() == 0
    assert capsys.readouterr().out == spec_docs.spec_reference()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file(page):
    bad = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
        elif ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{target}: outside the repository")
    assert not bad, "\n".join(bad)
