"""swa-repro: reproduce, explain and gate sglang's sliding-window paged-prefill bug.

sglang <= 0.5.15.post1 planned FlashInfer's BatchPrefillWithPagedKVCacheWrapper without
``window_left`` and passed the window only to the deprecated ``forward()``; FlashInfer picks
its compiled module at plan time, so the per-element window mask was compiled out.
"""

__version__ = "0.1.0"
