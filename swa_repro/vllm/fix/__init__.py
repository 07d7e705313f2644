"""The cap-route fix of vLLM's soft-cap finding (``--fix cap-route``), as ``sglang.fix`` holds sglang's:
``fixes`` (the backend's edit, the fixed overlay, the upstream diff), ``flashinfer_utils`` (the rule in
``vllm/utils/flashinfer.py``, where vLLM decides), ``unit_test`` (vLLM's unit test in the diff) and
``upstream_refs`` (the upstream threads on each vLLM finding)."""
