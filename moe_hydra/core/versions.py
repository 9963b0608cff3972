"""Every megatron-core version-dependent name and rule, in one place.

Supported: megatron-core 0.16.1 (the newest for Python 3.11) up to 0.19.x (NGC containers,
Python 3.12). Facts were read from the 0.16.1 and 0.19.2 wheels' ``transformer_config.py``.

The version is read from the installed distribution's metadata, never by importing megatron
(which costs seconds): planning stays fast, and a laptop without megatron-core plans against the
newest supported release.

Pure: standard library only.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from dataclasses import dataclass

SUPPORTED_RANGE = ">=0.16.1,<0.20"
NEWEST_SUPPORTED = "0.19.2"

_BASE_RECOMPUTE = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
_BASE_OFFLOAD = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


@functools.lru_cache(maxsize=64)
def _key(version: str) -> tuple[int, int, int]:
    nums = [int(x) for x in re.findall(r"\d+", version)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its metadata, nothing imported), or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def installed_mcore_version() -> str | None:
    """The installed megatron-core version, or None when it is not installed."""
    return installed_version("megatron-core")


@dataclass(frozen=True, slots=True)
class McoreFacts:
    """What differs between the supported megatron-core releases."""

    version: str
    installed: bool

    @property
    def _v(self) -> tuple[int, int, int]:
        return _key(self.version)

    @property
    def ep1_etp_wrong_expert_grads(self) -> bool:
        """TP>1, ETP!=TP, EP=1 leaves expert gradients unsummed over TP (silently wrong).

        Megatron-LM #5916 ("Fix gradient-norm undercounting when using EP and TP"); 0.16.1 is
        affected, 0.19.2 is not.
        """
        return self._v < (0, 19, 0)

    @property
    def recompute_modules(self) -> frozenset[str]:
        extra = ("gdn_norm_out",) if self._v >= (0, 19, 0) else ()
        return frozenset(_BASE_RECOMPUTE + extra)

    @property
    def offload_modules(self) -> frozenset[str]:
        extra = ("fused_group_mlp",) if self._v >= (0, 19, 0) else ()
        return frozenset(_BASE_OFFLOAD + extra)

    @property
    def shared_expert_overlap_dispatchers(self) -> frozenset[str]:
        return frozenset({"alltoall", "flex"} if self._v >= (0, 19, 0) else {"alltoall"})

    def flex_num_sms_field(self, backend: str) -> str:
        """TransformerConfig field for the SMs of a flex backend."""
        if self._v >= (0, 19, 0):
            return "moe_flex_dispatcher_num_sms"
        return {"deepep": "moe_deepep_num_sms", "hybridep": "moe_hybridep_num_sms"}[backend]

    @property
    def cuda_graph_scope_field(self) -> str:
        """0.19 renamed ``cuda_graph_scope`` to ``cuda_graph_modules`` (the old name still migrates)."""
        return "cuda_graph_modules" if self._v >= (0, 19, 0) else "cuda_graph_scope"


def mcore_facts(version: str | None = None) -> McoreFacts:
    """Facts for ``version``, else the installed release, else the newest supported one."""
    if version is not None:
        return McoreFacts(version, installed=version == installed_mcore_version())
    installed = installed_mcore_version()
    return McoreFacts(installed or NEWEST_SUPPORTED, installed=installed is not None)
