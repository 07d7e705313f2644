"""Layer 2: real-kernel evidence: recordings made on a GPU with provenance, the recorded cases,
offline bundles for air-gapped GPU machines. Imports ``core`` and ``kernel``.
"""
