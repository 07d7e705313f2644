"""``swa-repro audit`` with ``--vllm VERSION``: the ``audit`` command the top-level CLI registered
first (sglang's, ``sglang.audit.cli``: ``cli.COMMANDS``) extended by the vLLM audit (``vllm.audit.core``);
without ``--vllm`` the command's own function runs, unchanged. Nothing of sglang is imported here."""

from __future__ import annotations

from swa_repro.engine.commands import extended


def register(sub) -> None:
    p = extended(sub, "audit")
    p.add_argument("--vllm", metavar="VERSION", help="audit this vLLM release's FlashInfer backend (0.20.0 or "
                   "later; its wheel's Python files as a cached overlay, run in a subprocess): per layer kind and "
                   "path (prefill, decode, mixed), the window, cap, scale and sinks asked vs told; with --model "
                   "PATH (a checkpoint's config.json or its folder) or FAMILY[,..]|all (default gemma2) and --gpu sm80|sm90|sm100[,..] (default sm90). With "
                   "--release-table: VERSION[,..] or 'table' (the table's releases) -> --out/vllm-releases.md + .json")
    p.add_argument("--diff", action="store_true", help="with --vllm X --fix cap-route: print the fix as a unified "
                   "diff against release X's flashinfer.py (the upstream diff) instead of auditing")
    other = p.get_default("func")  # the command as registered before: sglang's audit
    from swa_repro.vllm.audit import args as audit_args

    defaults = {k: p.get_default(k) for k in audit_args.DEFAULTED}
    p.set_defaults(**dict.fromkeys(defaults))  # None: not typed (audit_args.restore puts the default back)

    def func(a):
        given = audit_args.restore(a, defaults)
        if a.vllm is not None and a.sglang:
            from swa_repro.core.errors import UsageError

            raise UsageError("--vllm and --sglang: audit one project at a time")
        audit_args.check(a, given)  # every flag against the mode, both projects, before any work
        if a.vllm is None:
            if a.diff:
                from swa_repro.core.errors import UsageError

                raise UsageError("--diff goes with --vllm X --fix cap-route")
            return other(a)
        if a.release_table:
            from swa_repro.vllm.audit import table

            return table.main(a)
        from swa_repro.vllm.audit import core as audit

        return audit.main(a)

    p.set_defaults(func=func)
