"""Export: a resolved plan as the command that trains it with Megatron-LM's ``pretrain_gpt.py`` or a Megatron-Bridge
recipe.

:func:`export` walks :data:`~moe_hydra.handoff.table.TABLE` over the plan and prints, after the ``# moe_hydra:``
line, the launcher line and one flag (or Bridge override) per line. The comment line holds the run's own overrides
(``overrides.yaml`` of a run directory, or the command line) less the keys the flags below set: the group choices
by name, and whatever no flag says (the measurement window, a hardware preset's fields, ...). A value the pinned
Megatron-LM has no flag for is reported (:attr:`Exported.unmapped`), never dropped in silence; its override stays on
the comment line, so ingest still gives the same contract.

Pure: standard library and moe_hydra.core.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from moe_hydra.core import overrides as codec
from moe_hydra.core.versions import mcore_facts
from moe_hydra.handoff import table, text
from moe_hydra.handoff.table import MEGATRON_LM, Source, Unmapped

FORMATS = ("megatron-lm", "bridge")
# The ranks' environment (the hardware preset's NCCL_*, NVTE_*, CUDA_DEVICE_MAX_CONNECTIONS, ...): written as
# assignments before the launcher, read back from them.
ENV = "hardware.env"
# Overrides that say how moe_hydra runs, not what: never on the comment line.
NOT_CARRIED = ("stage", "repeat")
# Contract sections whose keys the flags may carry (everything else is moe_hydra's own: the comment line's).
SECTIONS = ("model", "hardware", "precision", "parallel", "recompute", "offload", "dispatcher", "routing", "kernels",
            "overlap", "optimizer", "data", "train")
# Megatron-Bridge recipes for the model presets (Megatron-Bridge v0.3.1, src/megatron/bridge/recipes)
BRIDGE_RECIPES = {
    "deepseek_v2_lite": "deepseek_v2_lite_pretrain_config", "deepseek_v3": "deepseek_v3_pretrain_config",
    "gpt3_175b": "gpt3_175b_pretrain_config", "gpt_oss_20b": "gpt_oss_20b_pretrain_config",
    "gpt_oss_120b": "gpt_oss_120b_pretrain_config", "kimi_k2": "kimi_k2_pretrain_config",
    "moonlight_16b_a3b": "moonlight_16b_pretrain_config", "olmoe_1b_7b": "olmoe_7b_pretrain_config",
    "qwen3_30b_a3b": "qwen3_30b_a3b_pretrain_config", "qwen3_235b_a22b": "qwen3_235b_a22b_pretrain_config",
}
# Keys of those sections that are no part of the contract (how a run is driven, not what it measures)
NOT_CONTRACT = ("train.fail_at_step", "train.log_interval", "data.path_to_cache")
SCRIPT = {"megatron-lm": "pretrain_gpt.py", "bridge": "scripts/training/run_recipe.py"}


@dataclass
class Exported:
    """The printed command, and what it could not say."""

    text: str
    header: list[str]
    lines: list[list[str]]  # flag lines (megatron-lm) or [override] lines (bridge)
    emitted: set[str]  # the moe_hydra keys the flags or overrides set
    unmapped: list[str] = field(default_factory=list)  # values without a flag at the pinned version
    no_flag: list[str] = field(default_factory=list)  # settings no flag can carry (kept on the comment line)


def header(original: list[str], emitted: set[str], hydra_overrides: list[str] = ()) -> list[str]:
    """The run's overrides the flags do not carry: every group choice, every key no emitted entry sets."""
    out = []
    for line in original:
        key = line.lstrip("+~").split("=", 1)[0].split("@", 1)[0]
        if key in NOT_CARRIED or key.startswith("hydra.") or key in emitted or (
                ENV in emitted and key.startswith(ENV + ".")):
            continue
        out.append(line)
    out += [h for h in hydra_overrides if h.startswith("hydra.searchpath=")]
    return out


def _not_carried(cfg: Any, covered: set[str]) -> list[str]:
    """Contract settings no entry of the table reads: shown so that nothing goes missing in silence."""
    out = [f"hardware={cfg.hardware.name} (its arch, memory, peaks and bandwidths)"]
    for section in SECTIONS:
        if section == "hardware":
            continue
        node = getattr(cfg, section)
        for f in dataclasses.fields(node):
            key = f"{section}.{f.name}"
            if key in covered or f.name == "name" or key in NOT_CONTRACT or key == ENV:
                continue
            out.append(codec.override(key, getattr(node, f.name)))
    out += [codec.override(f"contract.{k}", getattr(cfg.contract, k)) for k in ("warmup_steps", "window")]
    return out


def export(fmt: str, cfg: Any, r: Any, original: list[str], hydra_overrides: list[str] = ()) -> Exported:
    """The command for ``fmt`` ("megatron-lm" or "bridge") of the resolved plan ``r`` of the typed config ``cfg``;
    ``original``: the overrides that composed it (for the comment line)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: {' or '.join(FORMATS)}")
    s = Source(cfg, r, mcore_facts())
    launcher: list[list[str]] = []
    lines: list[list[str]] = []
    emitted: set[str] = set()
    unmapped: list[str] = []
    for e in table.TABLE:
        v = e.values(s)
        if v is None:
            continue
        try:
            if fmt == "megatron-lm":
                if not e.flags:
                    continue
                out = e.to_mlm(v, s)
                (launcher if e.launcher else lines).extend(out)
            else:
                if e.to_bridge is None:
                    continue
                pairs = e.to_bridge(v, s)
                if not pairs:
                    continue
                lines.extend([[codec.override(k, x)] for k, x in pairs])
        except Unmapped as u:
            unmapped.append(str(u))
            continue
        emitted.update(v)  # the keys this plan's values say (an entry may leave one to the comment line)
    if fmt == "megatron-lm":
        lines += [[flag, val] for flag, val, _, _ in table.FIXED]
        start = ["torchrun", *(f"{f}={v}" for f, v in launcher), SCRIPT[fmt]]
    else:
        lines += [[codec.override(k, v)] for k, v, _ in table.BRIDGE_FIXED]
        recipe = BRIDGE_RECIPES.get(cfg.model.name)
        start = ["torchrun", f"--nnodes={cfg.hardware.nodes}", f"--nproc-per-node={cfg.hardware.devices_per_node}",
                 SCRIPT[fmt], "--recipe", recipe or "RECIPE"]
        if recipe is None:
            unmapped.append(f"model={cfg.model.name}: Megatron-Bridge v0.3.1 has no recipe for it; replace RECIPE with "
                            "one whose model provider has this shape")
        emitted.update({"hardware.nodes", "hardware.devices_per_node"})
    if fmt == "megatron-lm":
        covered = {k for e in table.TABLE if e.flags for k in e.keys}
    else:  # a key with a Bridge form, or one that does not apply to this plan
        covered = {k for e in table.TABLE if e.to_bridge is not None or e.values(s) is None for k in e.keys}
    no_flag = _not_carried(cfg, covered | {"hardware.nodes", "hardware.devices_per_node"})
    env = getattr(cfg.hardware, "env", None)
    if env is not None:
        emitted.add(ENV)
    h = header(original, emitted, list(hydra_overrides))
    return Exported(text.render(h, start, lines, env=dict(env or {})), h, lines, emitted, unmapped, no_flag)


def report(fmt: str, x: Exported) -> list[str]:
    """What export says on stderr: the values without a flag, then the settings no flag carries."""
    where = MEGATRON_LM if fmt == "megatron-lm" else "Megatron-Bridge v0.3.1 (megatron-core 0.16)"
    out = [f"not mapped ({where}): {u}" for u in x.unmapped]
    if x.no_flag:
        out.append(f"no {'pretrain_gpt.py flag' if fmt == 'megatron-lm' else 'Megatron-Bridge override'} carries "
                   f"these (the '# moe_hydra:' line keeps them where the run's command line set them): "
                   + " ".join(x.no_flag))
    return out
