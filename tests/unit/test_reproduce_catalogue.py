"""The catalogue's quick entries: every paper has one (``testbed reproduce ID --quick``)."""

from analysis.reproduction import PAPERS, load_catalogue

QUICK = {}

for _e in load_catalogue():  # the first entry of each paper that has a quick version
    if _e.quick is not None:
        QUICK.setdefault(_e.paper, _e)


def test_every_paper_has_a_quick_entry():
    assert sorted(QUICK) == sorted(PAPERS)
