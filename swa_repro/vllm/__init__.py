"""vLLM's FlashInfer attention backend audited on CPU (issue #27), laid out as ``sglang/`` is: a release
as a cached overlay without its compiled extension (``provision``), the families and a user's checkpoint
(``families``, ``registry``, ``checkpoint``), the audit (``audit/``: the command, the child that drives
the release's metadata builder and ``FlashInferImpl`` with recording FlashInfer stand-ins, the verdict,
the table, the live step), the cap-route fix (``fix/``) and ``swa-repro patch --vllm`` (``patch/``)."""
