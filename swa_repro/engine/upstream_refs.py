"""An upstream thread (issue or PR) as the project cites it, and the threads both engines' findings cite.

The record (:class:`Ref`: its state as the thread showed it when read, summaries ours, not the
thread's words) is the same for sglang's findings (``sglang.fix.upstream_refs``) and vLLM's
(``vllm.fix.upstream_refs``); :data:`ISSUE_33915` (sglang's dropped soft cap, the same loss on vLLM's
routes) is cited by both.
"""

from __future__ import annotations

from dataclasses import dataclass

SGLANG, FLASHINFER = "sgl-project/sglang", "flashinfer-ai/flashinfer"


@dataclass(frozen=True)
class Ref:
    number: int
    repo: str  # SGLANG | FLASHINFER
    kind: str  # issue | pr
    title: str
    state: str  # open | closed | merged | unknown, as the thread showed it
    url: str
    covers: str  # what the thread reports or changes
    versus: str  # how our diff differs, and which is better where

    @property
    def label(self) -> str:
        return f"{self.repo.split('/')[1]} #{self.number}"


def _gh(repo: str, kind: str, number: int) -> str:
    return f"https://github.com/{repo}/{'pull' if kind == 'pr' else 'issues'}/{number}"


def ref(number, repo, kind, title, state, covers, versus) -> Ref:
    return Ref(number, repo, kind, title, state, _gh(repo, kind, number), covers, versus)


# ----------------------------------------------------------------------------- cited by both engines
ISSUE_33915 = ref(33915, SGLANG, "issue", "[Bug] FlashInfer backend drops attn_logit_softcapping: the cap is "
                  "passed to the deprecated forward() instead of plan(), so gemma-2 and grok-1 run uncapped",
                  "open", "a report of the cap reaching only `forward()` (Gemma-2, Grok-1 uncapped on the default "
                  "backend) and a repro of the same loss of `window_left` on the ragged path",
                  "the same diagnosis, plus the verify and CUDA-graph paths and a per-path audit")
