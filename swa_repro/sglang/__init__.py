"""Layer 3: sglang's own code: the backend patch, the harness that drives its real
``FlashInferAttnBackend``, traces and replay, sglang-check, the plan/forward audit, model configs.
Imports ``core``, ``kernel`` and ``evidence``.
"""
