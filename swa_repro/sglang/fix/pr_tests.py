"""The registered regression test of each PR series (``pr_series``), as its commits grow it.

Each commit of a series adds the test methods its fix makes pass (``Step.tests``), so the file at
commit ``k`` holds the cases of commits ``1..k`` only and every commit passes its own test. The
methods are the combined test's (``docs/upstream/test/registered/.../test_flashinfer_plan_time_params.py``)
cut per finding, plus the two a series alone needs (soft-cap decode under CUDA graphs; the Cohere2
runner window). A file is built from the pieces its methods use (case lists, runners, imports) and
formatted by ruff (sglang's formatter) so ``ruff format --check`` holds after every commit.

``est_time`` is honest: the recorded H100/H200 runs of the combined test (``TIMINGS``) give the
seconds one test method took there, JIT builds of the kernel modules included; a file's estimate
is that times its GPU methods (a CPU-only file, Cohere2's, registers with ``register_cpu_ci``).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import dataclass

from swa_repro.sglang.fix.upstream_diff import LIVE

KIT = "sglang.test.kits.attention_unittest"
TIMINGS = ("call-20261206T0433-h100-graph-warm/regress.log", "call-20261205T1401-h200-kit-regress/regress.log")

# Test methods the CPU stand-ins cannot judge, and why (checked: they fail where the GPU passes).
NOT_ON_CPU = {
    "test_decode_window_soft_cap_cuda_graph": "the stand-in decode wrapper computes from the indices of its own "
    "plan(), not from the graph's buffers a replay refills: the kit's window-only CUDA-graph decode case fails "
    "on 0.5.23 as shipped on the CPU too, where its window is right",
}


# ----------------------------------------------------------------------------- pieces
CASES = {  # class-level case lists: name -> source (4-space indent inside the class)
    "NO_PREFIX_CASES": 'NO_PREFIX_CASES = make_swa_no_prefix_input_config_cases("flashinfer")',
    "PREFIX_CASES": 'PREFIX_CASES = make_swa_prefix_input_config_cases("flashinfer")',
    "DECODE_CASES": '''DECODE_CASES = (
    DenseAttentionCase(name="swa_decode_past_window", backend="flashinfer", forward_mode=ForwardMode.DECODE,
        num_heads=4, num_kv_heads=4, page_size=16, prefix_lens=(2, 4, 9, 17), sliding_window_size=4),
)''',
    "EAGLE_VERIFY_CASES": '''EAGLE_VERIFY_CASES = tuple(
    DenseAttentionCase(name=f"eagle_verify_swa_{'_'.join(map(str, prefix_lens))}", backend="flashinfer",
        forward_mode=ForwardMode.TARGET_VERIFY, num_heads=4, num_kv_heads=4, page_size=16,
        prefix_lens=prefix_lens, extend_lens=(3,) * len(prefix_lens), sliding_window_size=4)
    for prefix_lens in ((2, 9), (17, 7))
)''',
    "DFLASH_VERIFY_CASES": '''DFLASH_VERIFY_CASES = (
    DenseAttentionCase(name="dflash_verify_swa_past_window", backend="flashinfer",
        forward_mode=ForwardMode.TARGET_VERIFY, num_heads=4, num_kv_heads=4, page_size=16,
        prefix_lens=(1, 4, 9, 17), extend_lens=(3, 3, 3, 3), sliding_window_size=4),
)''',
}
PRECONDITION = {  # case list -> the precondition rows it needs (name, within its input)
    "NO_PREFIX_CASES": (("no_prefix", True),), "PREFIX_CASES": (("prefix", False), ("prefix_extend", True)),
    "DECODE_CASES": (("decode", False),), "EAGLE_VERIFY_CASES": (("eagle_verify", False),),
    "DFLASH_VERIFY_CASES": (("dflash_verify", False),),
}
HELPERS = {  # class-level helpers
    "_run_cases": '''def _run_cases(self, cases, *, paged=False, full_layer=False):
    for case in cases:
        mode = "paged" if paged else "default"
        with self.subTest(case=case.name, backend=case.backend, mode=mode):
            with envs.SGLANG_FLASHINFER_USE_PAGED.override(paged):
                if full_layer:
                    self._run_full_layer_case(case)
                else:
                    run_dense_attention_case(self, case, head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE)''',
    "_run_window_cases": '''def _run_cases(self, cases, *, paged=False):
    for case in cases:
        mode = "paged" if paged else "default"
        with self.subTest(case=case.name, backend=case.backend, mode=mode):
            with envs.SGLANG_FLASHINFER_USE_PAGED.override(paged):
                run_dense_attention_case(self, case, head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE)''',
    "_run_full_layer_case": '''def _run_full_layer_case(self, case):
    # A full-attention layer of the sliding-window model (gemma2's global
    # layers): the model and its metadata keep the case's window, the layer
    # has none, and neither has the reference.
    fixture = build_dense_attention_fixture(self, case, head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE)
    fixture.actual_module.attn.sliding_window_size = -1
    actual = run_dense_fixture_eager(fixture)
    full = replace(fixture, case=replace(case, sliding_window_size=None))
    expected = expected_dense_fixture_output(full)
    torch.testing.assert_close(actual, expected, atol=DENSE_ATOL, rtol=DENSE_RTOL)''',
    "_run_verify_cases": '''def _run_verify_cases(self, cases, spec_kind, topks, *, cuda_graph=False):
    run = run_dense_spec_verify_cuda_graph_case if cuda_graph else run_dense_spec_verify_case
    for case in cases:
        for topk in topks:
            with self.subTest(case=case.name, topk=topk, spec_kind=spec_kind):
                run(self, case, topk=topk, spec_kind=spec_kind, head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE)''',
    "_run_cuda_graph_decode_cases": '''def _run_cuda_graph_decode_cases(self, cases):
    for case in cases:
        with self.subTest(case=case.name, backend=case.backend):
            run_dense_cuda_graph_decode_case(self, case, head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE)''',
}
MODULE_HELPERS = {
    "_soft_cap": '''# The kit's projected logits are O(0.3): a cap below them changes the attention
# weights far beyond DENSE_ATOL, so a cap the kernel drops is caught.
LOGIT_CAP = 0.2


def _soft_cap(cases, suffix="soft_cap"):
    return tuple(replace(case, name=f"{case.name}_{suffix}", logit_cap=LOGIT_CAP) for case in cases)''',
    "_keys_outside_window": '''def _keys_outside_window(case, *, within_input=False):
    """Some query's window excludes a key (of its own input, if `within_input`)."""
    window = case.sliding_window_size
    return any((n if within_input else p + n) - 1 > window for p, n in zip(case.prefix_lens, case.input_lens))''',
}


@dataclass(frozen=True)
class Method:
    body: str  # the method's source (4-space indent inside the class), its ``def`` line first
    gpu: bool = True  # runs the kernels (counts toward est_time)


def _m(name: str, call: str, comment: str = "") -> tuple[str, Method]:
    lead = "".join(f"# {ln}\n" for ln in comment.splitlines())
    return name, Method(f"{lead}def {name}(self):\n    {call}")


METHODS = dict([
    _m("test_ragged_no_prefix_window", "self._run_cases(self.NO_PREFIX_CASES)",
       "Ragged extend without a cached prefix."),
    _m("test_ragged_prefix_window", "self._run_cases(self.PREFIX_CASES)",
       "Ragged extend over the new tokens + paged over the cached prefix, merged."),
    _m("test_ragged_no_prefix_soft_cap",
       'self._run_cases(_soft_cap(self.NO_PREFIX_CASES, "full_layer"), full_layer=True)',
       "The full layers of a capped sliding-window model (gemma2's global layers),\non each prefill path."),
    _m("test_ragged_prefix_soft_cap", 'self._run_cases(_soft_cap(self.PREFIX_CASES, "full_layer"), full_layer=True)'),
    _m("test_paged_window_soft_cap", "self._run_cases(_soft_cap(self.NO_PREFIX_CASES + self.PREFIX_CASES), paged=True)",
       "Paged-only extend (SGLANG_FLASHINFER_USE_PAGED=1): its window is planned\nsince #31501, the cap with this change."),
    _m("test_paged_soft_cap",
       'self._run_cases(_soft_cap(self.NO_PREFIX_CASES + self.PREFIX_CASES, "full_layer"), paged=True, full_layer=True)'),
    _m("test_decode_window_soft_cap", "self._run_cases(_soft_cap(self.DECODE_CASES))", "Decode."),
    _m("test_decode_soft_cap", 'self._run_cases(_soft_cap(self.DECODE_CASES, "full_layer"), full_layer=True)'),
    _m("test_decode_window_soft_cap_cuda_graph", "self._run_cuda_graph_decode_cases(_soft_cap(self.DECODE_CASES))",
       "Decode under CUDA graphs: capture plans the cap, replay keeps it."),
    _m("test_dflash_verify_window", 'self._run_verify_cases(self.DFLASH_VERIFY_CASES, "dflash", (1,))',
       "DFlash target verify of a window layer (a chain, no custom mask)."),
    _m("test_eagle_verify_window", 'self._run_verify_cases(self.EAGLE_VERIFY_CASES, "eagle", (1, 2))',
       "Target verify of a window layer: EAGLE chain and tree; NGRAM and Frozen-KV\nMTP share EAGLE's path."),
    _m("test_ngram_verify_window", 'self._run_verify_cases(self.EAGLE_VERIFY_CASES, "ngram", (1, 2))'),
    _m("test_frozen_kv_mtp_verify_window", 'self._run_verify_cases(self.EAGLE_VERIFY_CASES, "frozen_kv_mtp", (1, 2))'),
    _m("test_eagle_verify_window_cuda_graph",
       'self._run_verify_cases(self.EAGLE_VERIFY_CASES, "eagle", (1, 2), cuda_graph=True)',
       "Under CUDA graphs: capture, then replay on the captured wrappers, each of\nwhich reads its tree mask from "
       "its own packed-mask buffer."),
    _m("test_ngram_verify_window_cuda_graph",
       'self._run_verify_cases(self.EAGLE_VERIFY_CASES, "ngram", (1, 2), cuda_graph=True)'),
    _m("test_frozen_kv_mtp_verify_window_cuda_graph",
       'self._run_verify_cases(self.EAGLE_VERIFY_CASES, "frozen_kv_mtp", (1, 2), cuda_graph=True)'),
])
DFLASH_EXPECTATION = Method('''def test_dflash_expectation(self):
    # The query at prefix + j attends keys prefix + j - window .. prefix + j,
    # not the block's shared start prefix - window.
    case = self.DFLASH_VERIFY_CASES[0]
    masks = _make_flashinfer_dflash_swa_builtin_masks(case, device="cpu")
    window = case.sliding_window_size
    for prefix_len, mask in zip(case.prefix_lens, masks):
        with self.subTest(dflash_expectation=prefix_len):
            q_pos = torch.arange(mask.shape[0]).unsqueeze(1) + prefix_len
            k_idx = torch.arange(mask.shape[1]).unsqueeze(0)
            expected = (k_idx >= q_pos - window) & (k_idx <= q_pos)
            self.assertTrue(torch.equal(mask.cpu(), expected))''', gpu=False)
METHODS["test_dflash_expectation"] = DFLASH_EXPECTATION
COHERE2 = '''"""Cohere2 (Command R7B) plans the window its sliding layers are given.

The model runner builds FlashInfer's sliding-window wrapper only for a model
class with `get_attention_sliding_window_size`; Cohere2's layers pass
`config.sliding_window` to RadixAttention unchanged (Cohere's training
convention), so the runner's window is that value too.
"""

import unittest

from transformers import Cohere2Config

from sglang.srt.models.commandr import Cohere2ForCausalLM
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time={est}, suite="base-a-test-cpu")


class TestCohere2RunnerWindow(CustomTestCase):
    def test_runner_window_is_the_layers_window(self):
        for window in (4, 4096):
            with self.subTest(sliding_window=window):
                model = Cohere2ForCausalLM.__new__(Cohere2ForCausalLM)
                model.config = Cohere2Config(sliding_window=window)
                self.assertEqual(model.get_attention_sliding_window_size(), window)


if __name__ == "__main__":
    unittest.main()
'''

IMPORTS = (  # (module, name) in the order ruff's isort keeps; a name is imported where the file uses it
    ("unittest", None), ("dataclasses", "replace"), ("torch", None),
    ("sglang.srt.environ", "envs"), ("sglang.srt.model_executor.forward_batch_info", "ForwardMode"),
    ("sglang.srt.utils", "is_flashinfer_available"), ("sglang.test.ci.ci_register", "register_cuda_ci"),
    *((f"{KIT}.attention_methods.dense_attention", n) for n in (
        "DENSE_ATOL", "DENSE_RTOL", "DenseAttentionCase", "build_dense_attention_fixture",
        "expected_dense_fixture_output", "make_swa_no_prefix_input_config_cases",
        "make_swa_prefix_input_config_cases", "run_dense_attention_case", "run_dense_fixture_eager")),
    (f"{KIT}.runner_modes.cuda_graph_decode_runner", "run_dense_cuda_graph_decode_case"),
    *((f"{KIT}.runner_modes.speculative_target_verify_runner", n) for n in (
        "_make_flashinfer_dflash_swa_builtin_masks", "run_dense_spec_verify_case",
        "run_dense_spec_verify_cuda_graph_case")),
    ("sglang.test.test_utils", "CustomTestCase"),
)


# ----------------------------------------------------------------------------- est_time
def seconds_per_test() -> float:
    """The slowest recorded seconds per test method of the combined test on an H100/H200
    (``Ran N tests in Xs`` of each ``TIMINGS`` log; cold JIT builds included)."""
    rates = []
    for rel in TIMINGS:
        for n, s in re.findall(r"^Ran (\d+) tests? in ([\d.]+)s$", (LIVE / rel).read_text(), re.MULTILINE):
            if int(n) >= 10:  # the combined test's runs, not the kit's 4-test file
                rates.append(float(s) / int(n))
    if not rates:
        raise LookupError(f"no 'Ran N tests in Xs' line in {', '.join(TIMINGS)}: cannot estimate est_time")
    return max(rates)


def est_time(methods, rate: float | None = None) -> int:
    n = sum(METHODS[m].gpu for m in methods)
    return max(5, math.ceil(n * (seconds_per_test() if rate is None else rate) / 5) * 5)


# ----------------------------------------------------------------------------- a file
def _indent(src: str, n: int = 4) -> str:
    return "\n".join((" " * n + ln) if ln else ln for ln in src.splitlines())


def _uses(body: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", body) is not None


def _needs(methods, precondition: bool = True) -> tuple[list[str], list[str], list[str]]:
    """The case lists, class helpers and module helpers ``methods`` use, transitively."""
    body = "\n".join(METHODS[m].body for m in methods)
    helpers = []
    for _ in range(3):  # helpers call helpers
        helpers = [h for h in HELPERS if _uses(body + "\n".join(HELPERS[x] for x in helpers), f"self.{h}")]
    if "_run_cases" in helpers and "full_layer=True" not in body:  # no full layer: the window-only runner
        helpers = [h for h in helpers if h not in ("_run_cases", "_run_full_layer_case")] + ["_run_window_cases"]
    text = body + "\n".join(HELPERS[h] for h in helpers)
    cases = [c for c in CASES if _uses(text, f"self.{c}")]
    mods = [h for h in MODULE_HELPERS if _uses(text, h)]
    if cases and precondition:
        mods.append("_keys_outside_window")
    return cases, helpers, list(dict.fromkeys(m for m in MODULE_HELPERS if m in mods))


def _precondition(cases) -> str:
    rows = "".join(f'        ("{name}", self.{c}, {within}),\n' for c in cases for name, within in PRECONDITION[c])
    return ('def test_kit_cases_and_expectations(self):\n'
            '    # Window 4 makes keys i-4 .. i visible to the query at i: a case whose\n'
            '    # keys are all visible passes with the window dropped.\n'
            f'    for name, cases, within_input in (\n{rows}    ):\n'
            '        with self.subTest(cases=name):\n'
            '            self.assertTrue(\n'
            '                any(_keys_outside_window(c, within_input=within_input) for c in cases),\n'
            '                f"no case of {[c.name for c in cases]} has keys outside the window",\n'
            '            )')


def registrations(sm100: bool, est: int) -> list[str]:
    """As sglang's registered attention tests call it: the 1-GPU H100/H200 runner, and the B200 one
    where the change is sm100's (FlashInfer's cutlass ragged prefill)."""
    out = [f'register_cuda_ci(est_time={est}, stage="base-b", runner_config="1-gpu-large")']
    if sm100:
        out.append(f'register_cuda_ci(est_time={est}, stage="base-b", runner_config="1-gpu-b200")')
    return out


def test_text(doc: str, methods, *, sm100: bool = False, cls: str = "TestFlashInferPlanTimeParams",
              rate: float | None = None, precondition: bool = True) -> str:
    """The registered test holding ``methods`` (in ``METHODS``' order), ruff-formatted; with
    ``precondition``, a check that each case list it uses has keys outside the window (a window
    test whose keys are all visible passes with the window dropped)."""
    if methods == ("cohere2",):
        return ruff_format(COHERE2.format(est=5))
    methods = [m for m in METHODS if m in methods]
    cases, helpers, mods = _needs(methods, precondition)
    members = ["# FlashInfer SM90 prefill kernels require value head dim in {64, 128, 256}.\n"
               "HEAD_DIM = 64\nHIDDEN_SIZE = 256", *(CASES[c] for c in cases), *(HELPERS[h] for h in helpers)]
    if cases and precondition:
        members.append(_precondition(cases))
    members += [METHODS[m].body for m in methods]
    body = "\n\n".join(_indent(m) for m in members)
    klass = (f'@unittest.skipIf(\n    not torch.cuda.is_available() or not is_flashinfer_available(),\n'
             f'    "CUDA + flashinfer are required",\n)\nclass {cls}(CustomTestCase):\n{body}\n')
    module = "\n\n\n".join(MODULE_HELPERS[m] for m in mods)
    rest = "\n".join(registrations(sm100, est_time(methods, rate))) + "\n\n" + module + "\n\n\n" + klass
    rest += '\n\nif __name__ == "__main__":\n    unittest.main()\n'
    return ruff_format(f'"""{doc.strip()}\n"""\n\n' + _imports(rest) + "\n\n" + rest)


def _imports(rest: str) -> str:
    plain = [m for m, n in IMPORTS if n is None and _uses(rest, m)]
    froms: dict[str, list[str]] = {}
    for m, n in IMPORTS:
        if n is not None and _uses(rest, n):
            froms.setdefault(m, []).append(n)
    std = [f"import {m}" for m in plain if m == "unittest"] + [f"from {m} import {', '.join(ns)}"
                                                               for m, ns in froms.items() if m == "dataclasses"]
    third = [f"import {m}" for m in plain if m == "torch"]
    first = [f"from {m} import " + (ns[0] if len(ns) == 1 else f"({', '.join(ns)},)")
             for m, ns in froms.items() if m.startswith("sglang")]
    return "\n\n".join("\n".join(g) for g in (std, third, first) if g)


def ruff_format(code: str) -> str:
    """``code`` as ``ruff format --isolated`` (sglang's formatter, default config) writes it."""
    r = subprocess.run([sys.executable, "-m", "ruff", "format", "--isolated", "-"], input=code, check=False,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ruff format refused the generated test: {r.stderr.strip()[:500]}")
    return r.stdout
