"""What an audit of an inference engine's FlashInfer backend stands on, whichever engine it is.

Why a layer of its own: sglang and vLLM are audited the same way (a release's own code as a cached
overlay, driven in a child process against FlashInfer call stand-ins that record what the kernel is
told; a file patched with a backup and reverted byte for byte; a generated table with its
provenance), and that machinery belongs to neither. With it here, ``swa_repro.sglang`` and
``swa_repro.vllm`` are siblings on top of this layer and never import each other
(``tests/test_layers.py``). Nothing here imports either engine; a few facts still carry sglang's
name (``bytecode``: only sglang's copies share a release's bytecode; ``forkserver``'s own roots;
``patching``'s "if sglang was reinstalled"; ``commands``' line for the removed ``--sglang-source``).

* ``standins``: FlashInfer's three wrappers as recording stand-ins (zero outputs), ``fast_decode_plan``,
  ``merge_state`` and ``CpuTorch`` (``torch`` as a backend module sees it on a CPU host);
* ``tolerance``: the live judge's ``ATOL`` / ``RTOL`` (bf16 against float64);
* ``child``: a module run as a child against an overlay (the parent's environment and fork, the
  child's ``--overlay``/``--out`` plumbing);
* ``forkserver``: the warm interpreter a child is forked from;
* ``bytecode``: one compile of a release for all its hard-linked copies;
* ``overlay``: where the cache keeps a release overlay, and the ``--no-deps --target`` installer;
* ``record``: an overlay checked against its wheel's ``RECORD``; an overlay's marker;
* ``patching``: a file patched in place with a backup, reverted byte for byte; the ``patch``
  command's output checks, diff and copy;
* ``provenance``: where the audit tables go (``docs/audit``) and what each says about how it was made;
* ``upstream_refs``: an upstream thread as cited (``Ref``), and the thread both engines cite;
* ``families``: model families (transformers' config classes), their small configs, GPU classes;
* ``commands``: the ``audit`` / ``patch`` parsers sglang registers and vLLM extends;
* ``config_reads``: the config keys a release's model class reads, from its source (both engines'
  checkpoint checks).
"""
