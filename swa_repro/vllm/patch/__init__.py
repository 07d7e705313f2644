"""``swa-repro patch ... --vllm``: the cap-route fix on the installed vLLM's two files (``cli``), with the
same backup and byte-identical revert as ``sglang.patch`` (``engine.patching``)."""
