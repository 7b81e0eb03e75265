"""The website's configuration (book/conf.py): valid, every notebook in its table of contents in
course order, the landing page's includes resolving. The executed build is `make book`; the
browser test (tests/browser/test_book_browser.py) builds a subset and opens it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _conf(monkeypatch, subset: str = ""):
    monkeypatch.setenv("BOOK_NOTEBOOKS", subset)
    spec = importlib.util.spec_from_file_location("book_conf", ROOT / "book" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


def test_every_notebook_is_in_the_book_in_course_order(monkeypatch):
    conf = _conf(monkeypatch)
    on_disk = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.md"))
    assert conf.NOTEBOOKS == on_disk and len(on_disk) >= 15
    assert [f"notebooks/{n}.md" for n in on_disk] == [
        p for p in conf.include_patterns if p.startswith("notebooks/")]
    index = (ROOT / "book" / "index.md").read_text()
    assert "../notebooks/[0-9]*" in index and ":glob:" in index  # sorted: course order


def test_a_subset_builds_only_what_it_names(monkeypatch):
    conf = _conf(monkeypatch, "00_token_explosion,07_tiny_dit_under_cp")
    assert conf.NOTEBOOKS == ["00_token_explosion", "07_tiny_dit_under_cp"]


def test_the_landing_page_includes_resolve():
    """Each {include} of the landing page names text that is in the file it includes, in order;
    every page the index lists exists."""
    index = (ROOT / "book" / "index.md").read_text()
    includes = re.findall(r'```\{include\} (\S+)\n:start-after: "([^"]+)"\n:end-before: "([^"]+)"',
                          index)
    assert [Path(f).name for f, _, _ in includes] == ["README.md", "README.md", "course_map.md"]
    for name, start, end in includes:
        text = (ROOT / "book" / name).resolve().read_text()
        assert start in text and end in text, f"{name}: {start!r} .. {end!r}"
        assert text.index(start) < text.index(end), f"{name}: {start!r} comes after {end!r}"
    for page in ("course_map", "commands", "multi_gpu", "troubleshooting", "layout"):
        assert f"\n{page}\n" in index and (ROOT / "book" / f"{page}.md").exists()


def test_the_executed_book_shows_stubs_and_static_dashboards():
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\nbook:"):]
    assert "CPCOURSE_IMPL=exercises" in target and "IPYTHONDIR=$(CURDIR)/book/ipython" in target
    hook = ROOT / "book" / "ipython" / "profile_default" / "startup" / "00-static-widgets.py"
    assert "_repr_mimebundle_" in hook.read_text()


def test_a_subset_with_a_typo_is_refused(monkeypatch, capsys):
    """Probe C5: `make book BOOK_NOTEBOOKS=00_token_explsion` built an empty book, exit 0."""
    with pytest.raises(SystemExit) as info:
        _conf(monkeypatch, "00_token_explsion")
    err = capsys.readouterr().err
    assert info.value.code == 2 and "00_token_explsion" in err and "00_token_explosion" in err
