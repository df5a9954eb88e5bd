"""The published benchmark figures agree with the committed results (``bench/tables.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import tables
from bench.common import RESULTS
from bench.figures import Result
from tests.integration.chaos_report import ChaosReport, ScenarioReport


def test_readme_figures_match_the_committed_results(capsys: pytest.CaptureFixture[str]) -> None:
    code = tables.main(["--check"])
    assert code == 0, capsys.readouterr().err


def test_every_block_is_published_somewhere() -> None:
    text = "".join(path.read_text() for path in tables.DOCUMENTS)
    missing = [name for name in tables.BLOCKS if f"<!-- bench:{name} -->" not in text]
    assert missing == []


def _results(tmp_path: Path, b_over_a: float) -> dict[str, Result]:
    realtime = json.loads((RESULTS / "realtime.json").read_text())
    realtime["throughput_ratio_b_over_a"] = b_over_a
    (tmp_path / "realtime.json").write_text(json.dumps(realtime))
    return tables.load_results(tmp_path)


def _document(tmp_path: Path) -> Path:
    path = tmp_path / "README.md"
    path.write_text("# Figures\n\n<!-- bench:readme-figures -->\n<!-- /bench:readme-figures -->\n")
    return path


def test_a_rendered_document_passes_and_a_changed_result_fails_it(tmp_path: Path) -> None:
    document = _document(tmp_path)
    document.write_text(tables.render(document.read_text(), _results(tmp_path, 3.34)))
    assert "**3.34×** requests/s" in document.read_text()
    assert tables.problems([document], _results(tmp_path, 3.34)) == []

    [problem] = tables.problems([document], _results(tmp_path, 2.5))
    assert "figures differ" in problem
    assert "-| batching vs one request" in problem and "**2.50×**" in problem


def test_a_figure_edited_by_hand_fails(tmp_path: Path) -> None:
    document = _document(tmp_path)
    results = _results(tmp_path, 3.34)
    document.write_text(tables.render(document.read_text(), results).replace("3.34×", "3.80×"))
    assert [p for p in tables.problems([document], results) if "figures differ" in p]


def test_a_missing_result_is_said_not_invented(tmp_path: Path) -> None:
    rendered = tables.render(_document(tmp_path).read_text(), _results(tmp_path, 3.34))
    assert "not measured: `bench/results/formation.json` is absent" in rendered


def test_a_figure_outside_a_block_fails_unless_it_is_the_source_documents(
    tmp_path: Path,
) -> None:
    document = _document(tmp_path)
    results = _results(tmp_path, 3.34)
    rendered = tables.render(document.read_text(), results)
    document.write_text(rendered + "\nThe worker does 2,000 req/s.\n")
    [problem] = tables.problems([document], results)
    assert "outside a bench block: The worker does 2,000 req/s." in problem

    document.write_text(rendered + "\nThe source document measured 3.8× and 35 %.\n")
    assert tables.problems([document], results) == []


def test_a_marker_without_its_partner_fails(tmp_path: Path) -> None:
    document = tmp_path / "README.md"
    document.write_text("<!-- bench:machine -->\ntext\n")
    assert tables.problems([document], {}) == [f"{document}: a bench marker has no partner"]


def test_an_unknown_block_is_refused() -> None:
    with pytest.raises(KeyError, match="no-such-block"):
        tables.render("<!-- bench:no-such-block -->\n<!-- /bench:no-such-block -->", {})


def test_the_guarantees_table_renders_what_the_chaos_suite_wrote(tmp_path: Path) -> None:
    report = ChaosReport()
    row = ScenarioReport("3 SIGKILLs in 3,000 requests", 3000, 3000, 0, 32, 3, 14.36, 0.07)
    report.add(row)
    report.write(tmp_path / "chaos.json")
    block = tables.guarantees_block(tables.load_results(tmp_path))
    assert "| 3 SIGKILLs in 3,000 requests | 3,000 | 3,000 | 0 | 32 | 3 | 14.4 s | 0.1 s |" in block
    assert "BATCHPIPE_CHAOS_REPORT=bench/results/chaos.json" in block
    assert "not measured: `bench/results/chaos.json` is absent" in tables.guarantees_block({})
