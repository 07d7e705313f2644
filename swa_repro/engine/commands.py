"""The sub-commands both engines serve (``audit``, ``patch``): one parser each, sglang's registered
first and vLLM's options added to it (``cli.COMMANDS`` lists both modules in that order), so
neither engine imports the other's command line. Also what belongs to the command, not an engine:
the one line a removed flag gets.
"""

from __future__ import annotations

REMOVED_SOURCE = ("--sglang-source was removed: it spliced another release's backend file into the installed "
                  "package; use --sglang VERSION to audit that release's own code")


def extended(sub, name: str):
    """The parser of ``name`` an earlier module registered on ``sub`` (``cli.build_parser``), for an
    engine to add its options and wrap its function; a registration out of order fails loudly."""
    try:
        return sub.choices[name]
    except KeyError:
        raise RuntimeError(f"`{name}` must be registered before an engine extends it (cli.COMMANDS)") from None
