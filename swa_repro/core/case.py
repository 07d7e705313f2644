"""One dataclass describes a batch paged prefill case; every entry point validates through it.

Positions: a request with prefix ``P`` and extend ``E`` has ``kv_len = P + E`` keys at positions
``0..kv_len-1`` and its queries sit at positions ``P..P+E-1``. Which keys a query may see is said
in :func:`swa_repro.core.reference.visible` (per element) and, in interval form, in
:func:`swa_repro.core.intervals.intended_bounds`; ``tests/test_reference.py`` holds them equal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from swa_repro.core.errors import CaseError
from swa_repro.core.versions import FLASHINFER_VERSIONS, unmodelled_message

BACKENDS = ("fa2", "fa3", "auto")
# Head dims FlashInfer compiles its batch prefill modules for (both fa2 and fa3 JIT templates
# dispatch on 64/128/256; flashinfer/jit/attention/modules.py and the sm90 head-dim dispatch).
HEAD_DIMS = {"fa2": (64, 128, 256), "fa3": (64, 128, 256)}
# What a case may hold; validate() names the limit hit, in one line that says what to change.
# Heads: CUDA caps gridDim.y/z at 65535; fa3's batch prefill has one grid row per query head
# (hopper/tile_scheduler.cuh:226 get_grid_dim, 0.6.12 and 0.7.2.post1), fa2 one grid slice per KV
# head (prefill.cuh:2808 / 4396 ``nblks(padded_batch_size, 1, num_kv_heads)``); one cap on query
# heads keeps a case valid on every backend the model compares.
MAX_HEADS = 65535
# sum(extend_lens) * num_qo_heads, the (query row, head) pairs of a batch: the model and the probe
# hold (qo, heads) int64 arrays per request and `swa-repro mask` writes two int32 ones (128 MiB at
# the limit); below it fa2's 32-bit q/o offsets (``q_indptr * q_stride_n``, prefill.cuh:2469 /
# 3871) cannot overflow either: rows * heads * head_dim(<= 256) < 2**32.
MAX_QO_HEAD_ROWS = 2**24
# Keys of one request (prefix + extend): FlashInfer holds kv lengths and positions in 32-bit ints
# (int32 indptr, uint32 kv_len, prefill.cuh:2435 / 3820), `swa-repro mask` stores them as int32.
MAX_KV_LEN = 2**31 - 1
# Requests of a batch: the model walks them one by one in Python (~0.3 ms each on one core).
MAX_BATCH = 16384


@dataclass(frozen=True)
class Case:
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    num_qo_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    window_left: int = 4  # the layer's window: what forward()/run() passes
    plan_window_left: int = -1  # what plan() got: -1 is the bug, == window_left is the fix
    backend: str = "fa2"  # fa2 | fa3 | auto (auto is fa3 on sm90)
    disable_split_kv: bool = False
    fixed_split_size: int = -1  # pages; sglang's deterministic mode sets it
    sm_count: int = 132  # H100/H200
    arch: tuple[int, int] = (9, 0)
    flashinfer_version: str = "0.7.2.post1"
    name: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "prefix_lens", tuple(int(x) for x in self.prefix_lens))
        object.__setattr__(self, "extend_lens", tuple(int(x) for x in self.extend_lens))
        object.__setattr__(self, "arch", tuple(int(x) for x in self.arch))
        self.validate()

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def kv_lens(self) -> tuple[int, ...]:
        return tuple(p + e for p, e in zip(self.prefix_lens, self.extend_lens))

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def resolved_backend(self) -> str:
        """``auto`` -> fa3 on sm90 (flashinfer/utils.py determine_attention_backend), else fa2."""
        if self.backend != "auto":
            return self.backend
        return "fa3" if self.arch[0] == 9 else "fa2"

    def with_(self, **kw) -> "Case":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prefix_lens"], d["extend_lens"], d["arch"] = list(self.prefix_lens), list(self.extend_lens), list(self.arch)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def validate(self) -> None:
        if not self.extend_lens:
            raise CaseError("empty batch: give at least one request (--extend-lens 8 --prefix-lens 0)")
        if len(self.prefix_lens) != len(self.extend_lens):
            raise CaseError(
                f"--prefix-lens has {len(self.prefix_lens)} entries but --extend-lens has "
                f"{len(self.extend_lens)}: give one prefix length per request"
            )
        if any(x < 0 for x in self.prefix_lens):
            raise CaseError("prefix lengths must be >= 0")
        if any(x < 1 for x in self.extend_lens):
            raise CaseError("extend lengths must be >= 1: every request needs at least one query")
        if self.window_left < -1 or self.plan_window_left < -1:
            raise CaseError("window_left must be -1 (no window) or >= 0; got "
                            f"window_left={self.window_left}, plan_window_left={self.plan_window_left}")
        if self.num_qo_heads < 1 or self.num_kv_heads < 1:
            raise CaseError(f"head counts must be >= 1; got num_qo_heads={self.num_qo_heads}, "
                            f"num_kv_heads={self.num_kv_heads}")
        if self.num_kv_heads > self.num_qo_heads:
            raise CaseError(
                f"num_kv_heads={self.num_kv_heads} > num_qo_heads={self.num_qo_heads}: "
                "GQA layouts need at least as many query heads as KV heads"
            )
        if self.num_qo_heads % self.num_kv_heads:
            raise CaseError(
                f"num_qo_heads={self.num_qo_heads} is not a multiple of num_kv_heads={self.num_kv_heads}: "
                "choose num_qo_heads = k * num_kv_heads"
            )
        self._check_size()
        if self.backend not in BACKENDS:
            raise CaseError(f"backend {self.backend!r} unknown: use one of {', '.join(BACKENDS)}")
        if self.head_dim not in HEAD_DIMS[self.resolved_backend]:
            raise CaseError(f"head_dim={self.head_dim} is not compiled by the {self.resolved_backend} backend: "
                            f"use one of {HEAD_DIMS[self.resolved_backend]}")
        if self.page_size < 1:
            raise CaseError("page_size must be >= 1")
        if self.sm_count < 1:
            raise CaseError("sm_count must be >= 1")
        if self.flashinfer_version not in FLASHINFER_VERSIONS:
            raise CaseError(unmodelled_message(self.flashinfer_version))

    def _check_size(self) -> None:
        """The limits above (MAX_HEADS, MAX_BATCH, MAX_KV_LEN, MAX_QO_HEAD_ROWS), each one line."""
        if self.num_qo_heads > MAX_HEADS:
            raise CaseError(f"num_qo_heads={self.num_qo_heads} is more than FlashInfer can launch: at most "
                            f"{MAX_HEADS} query heads (CUDA's grid limit; fa3 has one grid row per head)")
        if self.batch_size > MAX_BATCH:
            raise CaseError(f"{self.batch_size} requests is more than the model walks: give at most {MAX_BATCH}")
        if max(self.kv_lens) > MAX_KV_LEN:
            raise CaseError(f"a request has {max(self.kv_lens)} keys (prefix + extend): FlashInfer holds key "
                            f"positions in int32, give at most {MAX_KV_LEN} (2**31 - 1) per request")
        rows = sum(self.extend_lens) * self.num_qo_heads
        if rows >= MAX_QO_HEAD_ROWS:
            raise CaseError(f"sum(extend_lens) x num_qo_heads = {rows} (query row, head) pairs is too large to model "
                            f"in memory: keep it below 2**24 = {MAX_QO_HEAD_ROWS} (fewer or shorter requests, or fewer heads)")
