"""What a fork server (``engine.forkserver``) with nothing learned yet preloads before its first fork.

A server preloads what earlier servers learned (its cache's ``preload_file``); with an empty cache
(``make test`` from nothing: a server per xdist worker, each started before any run has ended) it
knew nothing, so its first run imported torch & co. itself and the server imported them all again
after it, before answering. A warm server's preload imports the packages themselves first (parents
first: ``forkserver._preload``), and for 0.5.23's runs those were ~90% of it (11.8 of 13.3 s on 2
cores, every one of the 77 safe roots learned). So a server with nothing learned starts from them:
its first run then imports only the rest, and the server after it ~1.5 s more. test_upstream_kit
from an empty cache, alone on 2 cores: its first kit run 58.3 s -> 26.8 s (24.8 s with a learned
file), the file 92 s -> 56 s; test_remedy's 0.5.23 sweep (two first runs at once): 90-103 -> 75-85
CPU-s, its wall time within this machine's noise (56-66 s both ways: the two runs had imported
torch & co. in parallel on the two cores, the seed does it once, on one).
"""

from __future__ import annotations

import importlib.util
import os

SEED = "SWA_REPRO_FORKSERVER_SEED"  # "0": a server with nothing learned preloads nothing (learning alone)


def seed(known: set, roots) -> set:
    """``known`` (what earlier servers learned), else the installed packages of ``roots``
    (``forkserver.SAFE_ROOTS``), found without importing them."""
    if known or os.environ.get(SEED, "1") == "0":
        return known
    return {n for n in roots if importlib.util.find_spec(n) is not None}
