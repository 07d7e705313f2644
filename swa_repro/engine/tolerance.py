"""The live judge's tolerances: a kernel's bf16 output held against the float64 reference.

Both engines' live steps judge with these (``sglang.audit.live``, ``vllm.audit.live``), so an answer
means the same thing whichever engine made the call: a row is *wrong* when its error over the keys
the layer intends exceeds :data:`ATOL`; the model *agrees* with the kernel when every element is
within ``ATOL + RTOL * |reference|`` of the predicted reference (``torch.isclose``'s rule).
"""

ATOL = 2e-2  # bf16 outputs against float64 (the harness's tolerance)
RTOL = 2.0 ** -7  # one bf16 ulp, relative (the model's agreement only; a row is wrong by ATOL alone)
