"""The exit status of an answer, for CI: ``audit`` (sglang's family audit and plain audit), ``audit --vllm``
and ``doctor --model`` all map their answers' states through :func:`exit_status`, in this one place.

* 0: every answer is one that needs nothing done (not affected; FlashInfer refused for the model,
  so this bug never runs).
* 1: a finding (which ones: ``--fail-on``), or an answer the audit could not give: not driven, not
  built, unknown, and any state this table does not know (a new state fails until it is placed here,
  never passes by default).
* 2: bad input (``core.errors``, ``cli.main``), never from here.

``--fail-on`` (default ``any``):

* ``any``: every finding fails: on the default path, only with flags, only with speculative decoding;
  vLLM's ``affected`` and ``layer != HF``;
* ``default``: only a finding on the default paths of sglang's FlashInfer backend (``affected on the
  default path``; vLLM has no path split: its ``affected`` and ``layer != HF``); flags-only and
  speculative-only findings pass;
* ``never``: findings pass (a report only); an answer the audit could not give still fails.

Core knows the states as strings only (``sglang.audit.family_verdict.answer``, ``vllm.audit.verdict.cell``,
the plain audit's classes: ``sglang.audit.table.cell``), so every layer above can use it.
"""

from __future__ import annotations

FAIL_ON = ("any", "default", "never")
OK = frozenset({"not affected", "flashinfer refused", "refused"})
DEFAULT_PATH = frozenset({"affected on the default path", "affected", "layer != HF"})
OTHER_PATHS = frozenset({"only with flags", "only with speculative decoding"})
FAILS = {"any": DEFAULT_PATH | OTHER_PATHS, "default": DEFAULT_PATH, "never": frozenset()}

HELP = ("which answers exit 1 (CI): any (default) = any finding, on the default path, only with flags or only "
        "with speculative decoding; default = a finding on the default path only; never = none; an answer the "
        "audit could not give (not driven, not built, unknown) always exits 1; 0: not affected or FlashInfer "
        "refused; 2: bad input")


def exit_status(states, fail_on: str = "any") -> int:
    """0 or 1 for the answers' ``states`` (a family's, a cell's, a finding class's): 1 when any fails."""
    if fail_on not in FAILS:
        raise ValueError(f"fail_on {fail_on!r}: one of {', '.join(FAIL_ON)}")
    return int(any(s not in OK and (s in FAILS[fail_on] or s not in DEFAULT_PATH | OTHER_PATHS) for s in states))


def add_argument(parser) -> None:
    """``--fail-on any|default|never`` on a command that answers (argparse checks the choice: exit 2)."""
    parser.add_argument("--fail-on", choices=FAIL_ON, default="any", help=HELP)
