"""Why the spec-verify window gate leaves out UNO_VERIFY (``sglang.fix.uno_verify``): read from the
release's files; hand-written sources are the oracle for each way a release can be."""

from __future__ import annotations

import pytest

from swa_repro.sglang.fix import uno_verify as uv

BASE = "from abc import ABC\n\n\nclass SpecInput(ABC):\n    def is_verify_input(self):\n        return True\n"
UNO = "\n\n\nclass UnoForwardInput(SpecInput):\n    draft_token_num: int\n"
METHOD = "\n    def generate_attn_arg_prefill(self, **kw):\n        return None\n"
CALLER = "x = 1\nif spec:\n    a = spec_info.generate_attn_arg_prefill(\n        req=1,\n    )\n"


def _read(files: dict):
    def read(rel):
        if rel not in files:
            raise FileNotFoundError(rel)
        return files[rel]
    return read


def _files(uno=UNO, base=BASE):
    return {uv.UNO_INFO: "import torch" + uno, uv.SPEC_INFO: base, uv.BACKEND: CALLER}


def test_uno_without_the_method_is_not_served_by_flashinfer():
    r = uv.reading(_read(_files()))
    assert (r.input_line, r.base_line, r.call_lines) == (4, 4, (3,))
    assert not r.flashinfer_serves_it() and "not listed on purpose" in r.text() and ":3" in r.text()


@pytest.mark.parametrize("where", ["uno", "base"])
def test_the_method_on_uno_or_its_base_means_the_gate_must_list_it(where):
    files = _files(uno=UNO + METHOD) if where == "uno" else _files(base=BASE + METHOD)
    r = uv.reading(_read(files))
    assert r.flashinfer_serves_it() and "must list `UNO_VERIFY`" in r.text()


@pytest.mark.parametrize("files", [{}, {uv.UNO_INFO: "x = 1\n", uv.SPEC_INFO: BASE, uv.BACKEND: CALLER}],
                         ids=["no_uno_file", "no_uno_class"])
def test_a_release_without_uno_has_no_reading(files):
    assert uv.reading(_read(files)) is None


def test_0_5_23_cannot_serve_a_uno_verify_on_flashinfer():
    """0.5.23's own files: UnoForwardInput (uno_info.py:242) and SpecInput (spec_info.py:397) define no
    generate_attn_arg_prefill, which the backend's verify plan calls at :2273 (DFlash) and :2285."""
    from swa_repro.sglang.fix.upstream_diff import release_file

    r = uv.reading(release_file)
    assert r is not None and not r.flashinfer_serves_it()
    backend = release_file(uv.BACKEND).splitlines()
    assert r.call_lines and all("generate_attn_arg_prefill(" in backend[n - 1] for n in r.call_lines)
    assert release_file(uv.UNO_INFO).splitlines()[r.input_line - 1].startswith("class UnoForwardInput(")
