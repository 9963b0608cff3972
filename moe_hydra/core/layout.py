"""The two meshes of Parallel Folding as one value: degrees in, derived sizes out.

Runtime code uses the short degree names (``tp``, ``cp``, ``pp``, ``vpp``, ``ep``, ``etp``); the
config keeps Megatron-Core's names. :meth:`Layout.from_config` is the single mapping between the two
and the one place the ``expert_tensor_parallel_size: null`` sentinel (= TP) and a VPP implied by a
pipeline layout string are resolved.

    attention mesh:  world = TP x CP x DP  x PP
    expert mesh:     world = ETP x EP x EDP x PP
    min GPUs      =  PP x lcm(TP x CP, EP x ETP)   (the meshes overlap inside a PP stage)

Pure: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from moe_hydra.core.pipeline import stage_count


@dataclass(frozen=True, slots=True)
class Layout:
    world_size: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1
    etp: int = 1
    sp: bool = False
    # derived when built (every stage reads them, the layout search some hundred thousand times)
    dp: int = field(init=False)  # data-parallel size of the attention mesh (0 when the world does not divide)
    edp: int = field(init=False)  # expert data-parallel size (0 when the world does not divide)

    def __post_init__(self) -> None:
        w, attention, expert = self.world_size, self.tp * self.cp * self.pp, self.etp * self.ep * self.pp
        object.__setattr__(self, "dp", w // attention if attention > 0 and w % attention == 0 else 0)
        object.__setattr__(self, "edp", w // expert if expert > 0 and w % expert == 0 else 0)

    @classmethod
    def from_config(cls, cfg: Any) -> "Layout":
        """From a composed config (``hardware`` + ``parallel`` nodes)."""
        p = cfg.parallel
        tp, pp, vpp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.virtual_pipeline_model_parallel_size
        if vpp is None and p.pipeline_model_parallel_layout is not None and pp > 0:
            try:  # a layout string defines VPP = stages / PP, as Megatron derives it
                stages = stage_count(p.pipeline_model_parallel_layout)
                vpp = stages // pp if stages > pp and stages % pp == 0 else None
            except ValueError:
                vpp = None  # the rules report the malformed layout
        return cls(
            world_size=cfg.hardware.nodes * cfg.hardware.devices_per_node,
            tp=tp,
            cp=p.context_parallel_size,
            pp=pp,
            vpp=vpp,
            ep=p.expert_model_parallel_size,
            etp=tp if p.expert_tensor_parallel_size is None else p.expert_tensor_parallel_size,
            sp=p.sequence_parallel,
        )

    @property
    def attention_model_size(self) -> int:
        """TP x CP x PP: the ranks one attention-mesh replica spans."""
        return self.tp * self.cp * self.pp

    @property
    def expert_model_size(self) -> int:
        """ETP x EP x PP: the ranks one expert-mesh replica spans."""
        return self.etp * self.ep * self.pp

    # Predicates a rule may ask instead of reading a size: it then reads less (the layout search keys a rule's
    # answer by the values it read).
    @property
    def virtual_stages(self) -> bool:
        """Whether a pipeline rank holds several model chunks (VPP set: Megatron's interleaved schedule)."""
        return self.vpp is not None

    @property
    def expert_parallel(self) -> bool:
        """Whether the experts are split over ranks (EP > 1: an all-to-all)."""
        return self.ep > 1

    @property
    def min_gpus(self) -> int:
        return self.pp * math.lcm(self.tp * self.cp, self.ep * self.etp)

    def to_megatron(self) -> dict[str, Any]:
        """Megatron-Core names, plus the derived DP and EDP sizes."""
        return {
            "tensor_model_parallel_size": self.tp,
            "context_parallel_size": self.cp,
            "pipeline_model_parallel_size": self.pp,
            "virtual_pipeline_model_parallel_size": self.vpp,
            "sequence_parallel": self.sp,
            "expert_model_parallel_size": self.ep,
            "expert_tensor_parallel_size": self.etp,
            "data_parallel_size": self.dp,
            "expert_data_parallel_size": self.edp,
        }

    def describe(self) -> str:
        """``TP2 CP1 PP8 VPP4 DP64 | ETP1 EP64 EDP2`` — both meshes on one line."""
        vpp = f" VPP{self.vpp}" if self.vpp else ""
        sp = " SP" if self.sp else ""
        return (
            f"TP{self.tp} CP{self.cp} PP{self.pp}{vpp} DP{self.dp}{sp} | "
            f"ETP{self.etp} EP{self.ep} EDP{self.edp} PP{self.pp}"
        )
