"""The plan/forward contract audit of sglang's FlashInfer calls (``swa-repro audit``).

``core`` (drive every path, check each wrapper's plan against its forward, key-level verdicts),
``paths`` (the paths and how each is driven), ``env`` (the recorders and stand-ins around
sglang), ``keys`` (the keys each query attends, in token positions), ``live`` (recorded calls on
real FlashInfer against the float64 reference), ``release`` (another release's own code, in a
subprocess), ``table`` (the release table) and ``cli`` (the command). Importing the package
imports none of them: the command checks its arguments before torch is loaded.
"""
