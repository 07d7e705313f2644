"""Users' checkpoints for a live GPU call: each ``config.json`` read, checked against the release and
cut to its small config exactly as ``swa-repro audit --sglang X --model PATH`` does before its child
(``family_run.checkpoint_args``: ``checkpoint.check_release``, then ``checkpoint.small_config``),
written as the family child's ``--smalls-file`` (``{label: small config}``).

Why a command of its own: on the GPU machine the release is a site unpacked from the bundles, not a
cached overlay, and there is no network to provision one, so ``audit --model PATH`` cannot run there;
the family child can (``scripts/gpu_family.sh`` with ``CHECKPOINTS``). The label is the checkpoint's
folder name, which the child's document and the call's SUMMARY carry as the family.

``python -m swa_repro.sglang.audit.checkpoint_smalls --overlay SITE --sglang 0.5.23 --out F PATH [PATH ...]``
prints the labels, comma-separated (the child's ``--families``). Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.sglang import checkpoint as ckpt


def label_of(ck: ckpt.Checkpoint) -> str:
    """The folder holding the checkpoint's config.json: what a user calls the model."""
    return Path(ck.path).resolve().parent.name if Path(ck.path).name == "config.json" else Path(ck.path).name


def smalls(paths: list[str], version: str, overlay: Path) -> dict:
    """``{label: small config as a dict}``, in the order given; one line for a bad checkpoint or two
    checkpoints with one label (the child keys its cells by label)."""
    out: dict = {}
    for text in paths:
        ck = ckpt.read(text)
        ckpt.check_release(ck, version, overlay)
        label = label_of(ck)
        if label in out or "," in label:
            raise UsageError(f"{text}: its label {label!r} is taken or holds a comma: put each checkpoint's "
                             "config.json in a folder of its own name")
        out[label] = json.loads(json.dumps(asdict(ckpt.small_config(ck)), default=str))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.audit.checkpoint_smalls", description=__doc__)
    p.add_argument("--overlay", required=True, type=Path, help="the site holding the release's sglang package")
    p.add_argument("--sglang", required=True, help="the release's version (for the checks' lines)")
    p.add_argument("--out", required=True, type=Path, help="the --smalls-file to write")
    p.add_argument("paths", nargs="+", help="each checkpoint's config.json or its folder")
    a = p.parse_args(argv)
    try:
        if not (a.overlay / "sglang" / "srt" / "models").is_dir():
            raise UsageError(f"--overlay {a.overlay}: no sglang/srt/models there: give the site the bundle installed")
        doc = smalls(a.paths, a.sglang, a.overlay)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(",".join(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
