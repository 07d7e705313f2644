"""``swa-repro audit --vllm``: vLLM release X's FlashInfer backend driven on CPU, as ``sglang.audit`` is.

``cli`` (``--vllm`` added to sglang's ``audit`` command) and ``args`` (the flags checked together),
``core`` (the parent: arguments, overlay, cache, the child, what is printed), ``drive`` (the child: one
per release, a fork per GPU class and family), ``paths`` (the builder and impl per batch shape: asked vs
told) on ``kvcache`` (a layer's cache as the release lays it out) and ``env`` (the recording ``flashinfer``
package), ``platform_default`` (the release's backend order), ``verdict`` (a cell's answer), ``table``
(``docs/audit/vllm-releases``), and the live step: ``live``, ``live_kernels``, ``live_report``. Importing
the package imports none of them.
"""
