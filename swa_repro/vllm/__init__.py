"""vLLM's FlashInfer attention backend audited on CPU (issue #27, phase 1): a release as a cached
overlay without its compiled extension (``provision``), its metadata builder and ``FlashInferImpl``
driven in a child process with recording FlashInfer stand-ins (``standins``, ``drive``), and the
``swa-repro audit --vllm`` command (``cli``)."""
