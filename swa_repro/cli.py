"""``swa-repro`` console script: one subcommand per module; bad input is one line and exit 2.

Each subcommand lives in its own module as ``register(subparsers)`` that sets ``func``; this file
only wires them, importing each module lazily so a missing optional dependency (papermill,
flashinfer, sglang) breaks only the command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from swa_repro.core.errors import CaseError, UsageError

# subcommand -> (module that registers it, one-line help shown without importing it)
COMMANDS = {
    "run": ("swa_repro.notebook.runner", "execute the notebooks headless with papermill -> artifacts/"),
    "doctor": ("swa_repro.notebook.doctor", "what is installed, whether CUDA is usable, which mode auto picks"),
    "mask": ("swa_repro.kernel.mask_cmd", "effective masks of one case (model or live probe): intervals, or --dense masks"),
    "record": ("swa_repro.evidence.recordings", "(GPU) probe the recording cases on real FlashInfer -> recordings/"),
    "bundle": ("swa_repro.evidence.bundle_cli", "offline bundles for an air-gapped GPU machine"),
    "patch": (("swa_repro.sglang.patch.cli", "swa_repro.vllm.patch.cli"),
              "status/diff/apply/revert the sglang backend fix (or --vllm: vLLM's)"),
    "sglang-check": ("swa_repro.sglang.check", "sglang's real backend, unpatched vs patched, vs the reference"),
    "replay": ("swa_repro.sglang.trace", "(GPU) replay recorded wrapper calls against real FlashInfer"),
    "audit": (("swa_repro.sglang.audit.cli", "swa_repro.vllm.audit.cli"),
              "plan/forward contract audit of sglang's (or --vllm: vLLM's) FlashInfer calls"),
    "fuzz": ("swa_repro.evidence.fuzz", "the kernel model against the real kernel on random batches (GPU) or recordings"),
}


PURPOSE = ("Finds and fixes sliding-window and soft-cap attention errors in sglang's and vLLM's FlashInfer "
           "backends: is my model, on my GPU and release, affected, and which fix makes it exact? (audited on CPU)")
EPILOG = ("start: `swa-repro doctor --model gemma2` (the installed sglang, this GPU) or `swa-repro audit --sglang "
          "0.5.23 --model all`; exit status: 0 not affected, 1 affected or not answered (--fail-on), 2 bad input")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what to change) and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(argv=None) -> argparse.ArgumentParser:
    """Imports only the modules of the subcommand being run (the others register a stub with their
    help line), so ``swa-repro mask`` does not pay for sglang's or papermill's imports. A command
    both engines serve (``audit``, ``patch``) is registered by sglang's module, then extended by
    vLLM's (its ``--vllm``): the engines never import each other."""
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    p = OneLineParser(prog="swa-repro", description=PURPOSE, epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True)
    for name, (mod, help_) in COMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=help_, add_help=False)
            continue
        try:
            for m in (mod,) if isinstance(mod, str) else mod:
                importlib.import_module(m).register(sub)
        except ModuleNotFoundError as e:  # its optional dependency is missing
            sp = sub.add_parser(name, help=f"(unavailable: {e})")
            sp.set_defaults(func=lambda a, e=e, n=name: _unavailable(n, e))
    return p


def _unavailable(name, err):
    raise UsageError(f"'swa-repro {name}' is unavailable here: {err}. Run `make test` or "
                     "`pip install -e .` in the project's venv to install what it needs.")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (CaseError, UsageError) as e:
        print(f"swa-repro {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
