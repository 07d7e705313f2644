"""Classify, patch and revert sglang's FlashInfer backend for the sliding-window plan bug.

The bug (sglang <= 0.5.15.post1): ``FlashInferIndicesUpdaterPrefill.update_sliding_window``
(0.5.15.post1 ``srt/layers/attention/flashinfer_backend.py:1653``) calls ``call_begin_forward``
(:1822) for the paged-only SWA wrapper without a window, and ``call_begin_forward`` plans the paged
wrapper (:1960 ``wrapper_paged.begin_forward(...)``) without ``window_left``, so FlashInfer compiles
the left-window mask out. The fix (PR #31501, 0.5.16 ``flashinfer_backend.py:2054`` and
:2190-2192, :1933): ``call_begin_forward(..., window_left: int = -1)`` adds it to the paged plan
kwargs only when ``>= 0``; ``update_sliding_window`` passes the window for wrapper 0 when neither
ragged nor spec-verify.

Everything works on the real source text, one module per job:

* ``classify``: :func:`classify` reads its structure with ``ast`` (unfixed / fixed / unknown);
* ``edit``: :func:`transform` makes minimal line edits at ast locations (everything else byte for byte);
* ``stubs``: :func:`plan_window_lefts` runs the two methods on stub globals (:func:`compile_class`);
* ``swap``: the context managers :func:`patched` / :func:`unpatched` swap the two methods of the
  loaded class;
* ``files``: :func:`apply_in_place` (site-packages only with ``--in-place``, with a backup that
  ``engine.patching.revert_in_place`` restores byte for byte, sha256-checked);
* ``cli``: ``swa-repro patch`` shows or writes the change.
"""
