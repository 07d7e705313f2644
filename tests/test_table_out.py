"""A table of fixed releases asked into the committed tables' folder goes to its ``fixed/``, however
the folder is typed (``engine.provenance.table_out``): compared as typed, ``--out docs/audit`` at the
checkout's root wrote the fixed vLLM table over the unfixed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from swa_repro.engine.provenance import ROOT, TABLE_DIR, table_out


@pytest.mark.parametrize("typed", ["docs/audit", "./docs/audit", "docs/../docs/audit/", str(TABLE_DIR)])
def test_the_committed_folder_typed_any_way_sends_a_fixed_table_to_fixed(typed, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert table_out(Path(typed), True) == TABLE_DIR / "fixed"
    assert table_out(Path(typed), False).resolve() == TABLE_DIR.resolve()


def test_another_folder_is_kept(tmp_path):
    assert table_out(tmp_path, True) == tmp_path


@pytest.mark.parametrize("argv", [
    ["audit", "--release-table", "--vllm", "table", "--fix", "cap-route", "--out", "docs/audit"],
    ["audit", "--release-table", "--releases", "0.5.23", "--fix", "all", "--out", "docs/audit"],
])
def test_both_engines_table_commands_write_a_fixed_table_beside_the_unfixed(argv, monkeypatch):
    """Each engine's table command resolves ``--out`` before its first check of the folder (stopped
    there: nothing is audited or written)."""
    from swa_repro import cli
    from swa_repro.sglang.audit import cli as scli
    from swa_repro.vllm.audit import table as vtable

    seen = []

    class Stop(Exception):
        pass

    def stop(path, flag):
        seen.append(Path(path))
        raise Stop

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(vtable, "out_dir", stop)
    monkeypatch.setattr(scli, "out_dir", stop)
    with pytest.raises(Stop):
        cli.main(argv)
    assert seen == [TABLE_DIR / "fixed"]
