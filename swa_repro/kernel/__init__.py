"""Layer 1: FlashInfer's batch paged prefill: the CPU kernel model, the CPU wrapper stand-ins,
the live runner on real FlashInfer and the key-by-key probe. Imports only ``core``.
"""
