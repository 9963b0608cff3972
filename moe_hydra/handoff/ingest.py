"""Ingest: a Megatron-LM ``pretrain_gpt.py`` command (or a Megatron-Bridge override list) as moe_hydra overrides.

:func:`ingest` reads every flag through :data:`~moe_hydra.handoff.table.TABLE` (the table export writes with), so
export -> ingest gives back the values export wrote. Then:

- the group choices: those of the ``# moe_hydra:`` line when the command has one (export's); otherwise, for each
  group whose name is part of the contract, the preset whose fields match the flags (``flex`` + ``deepep`` ->
  ``dispatcher=deepep``), the closest one when none matches, with the differing fields set below it; the hardware
  preset from ``--hardware`` (the flags do not name a GPU);
- the comment line's other overrides, as they were;
- one override per key the flags set, less those the chosen presets already give the same value.

A flag the table does not read is refused, every one named at once (:class:`~moe_hydra.core.errors.Refused`),
except those that change nothing moe_hydra plans or measures (checkpointing, logging, the learning-rate schedule, data
plumbing: ``table.NOTED``), which are listed as ignored.

Pure: the standard library, omegaconf (the preset files) and moe_hydra.core.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from moe_hydra.core import overrides as codec
from moe_hydra.core.errors import Refused
from moe_hydra.handoff import export, presets, table, text
from moe_hydra.handoff.table import Flags

# Groups whose preset name is part of the contract (``<group>.name``): ingest names one.
NAMED = ("model", "precision", "recompute", "offload", "dispatcher", "routing")
# Bridge sections that change nothing moe_hydra plans or measures: accepted, listed as ignored
BRIDGE_NOTED = ("checkpoint.", "logger.", "profiling.", "validation.", "ft.", "straggler.", "nvrx_straggler.",
                "inprocess_restart.", "tensor_inspect.", "rerun_state_machine.", "scheduler.", "optimizer.adam_",
                "optimizer.min_lr", "tokenizer.tokenizer_model", "tokenizer.vocab_file", "tokenizer.merge_file",
                "dataset.num_workers", "dataset.data_sharding", "train.eval_interval", "train.manual_gc",
                "dist.distributed_timeout_minutes")


@dataclass
class Ingested:
    overrides: list[str]
    notes: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # every key the flags set (before presets are left out)
    choices: dict[str, str] = field(default_factory=dict)


def _header(words: list[str] | None) -> tuple[dict[str, str], list[str], list[tuple[str, Any]]]:
    """The comment line's group choices, its lines in order, and its key overrides as (key, value)."""
    choices: dict[str, str] = {}
    lines: list[str] = []
    keys: list[tuple[str, Any]] = []
    groups = {g for g, _ in presets.defaults()}
    for w in words or []:
        key = w.lstrip("+").split("=", 1)[0].split("@", 1)[0]
        lines.append(w)
        if w.startswith("~") or key.startswith("hydra."):
            continue
        value = _overrides([w]).popitem()[1]
        if key in groups:
            choices[key] = value
        else:
            keys.append((key, value))
    return choices, lines, keys


def _match(values: dict[str, Any], notes: list[str]) -> dict[str, str]:
    """The preset of each named group that the flag-derived ``values`` match (fewest differing fields)."""
    chosen: dict[str, str] = {}
    for group, default in presets.defaults():
        if group not in NAMED:
            continue
        in_section = {k: v for k, v in values.items() if k.startswith(group + ".")}
        if not in_section:
            continue
        ranked = sorted(presets.options(group),
                        key=lambda o: (len(presets.mismatches(group, o, in_section, group)), o != default, o))
        best = ranked[0]
        off = presets.mismatches(group, best, in_section, group)
        chosen[group] = best
        if off:
            notes.append(f"{group}={best}: the closest preset; the flags differ in {', '.join(off)} (set below; the "
                         f"contract then differs from {best}'s in those fields)")
    return chosen


def _known_mlm(flag: str) -> bool:
    return flag in table.entry_flags()


def _megatron_lm(cmd: text.Command, notes: list[str]) -> dict[str, Any]:
    """The moe_hydra values a pretrain_gpt.py command sets."""
    parsed, stray = text.parse_flags(cmd.args)
    if stray:
        raise Refused(f"words that belong to no flag: {' '.join(stray)}")
    launcher, lstray = text.parse_flags([w for w in cmd.launcher if w not in text.LAUNCHERS and w != "-m"
                                         and w != "torch.distributed.run"])
    if lstray:
        raise Refused(f"launcher words moe_hydra cannot read: {' '.join(lstray)}")
    unknown = sorted(f for f in parsed if not _known_mlm(f) and not table.noted(f))
    launcher = {f.replace("_", "-"): v for f, v in launcher.items()}
    unknown += sorted(f"torchrun {f}" for f in launcher
                      if f not in ("--nnodes", "--nproc-per-node") and not table.torchrun_noted(f))
    if unknown:
        raise Refused(f"cannot map {len(unknown)} flag{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
                      "(no moe_hydra setting; remove them to ingest the rest)")
    ignored = sorted(f for f in parsed if not _known_mlm(f)) + sorted(
        f"torchrun {f}" for f in launcher if f not in ("--nnodes", "--nproc-per-node"))
    g = Flags({**parsed, **{f: v for f, v in launcher.items() if f in ("--nnodes", "--nproc-per-node")}})
    wrong: list[str] = []  # every flag refused, said at once (not one per call)
    for flag, want, action, why in table.FIXED:
        if g.has(flag) and table._float(g.one(flag)) != float(want):
            if action == "refuse":
                wrong.append(f"{flag} {g.one(flag)}: {why} ({flag} {want})")
            else:
                ignored.append(f"{flag} {g.one(flag)} ({why})")
    for flag, accepted, why in table.CHECKED:
        if g.has(flag) and g.one(flag) not in accepted:
            wrong.append(f"{flag} {g.one(flag)}: {why} (accepted: {', '.join(accepted)})")
    values: dict[str, Any] = {}
    unused: list[str] = []
    for e in table.TABLE:
        if not e.flags:
            continue
        try:
            v = e.from_mlm(g)
        except Refused as r:
            wrong.append(str(r))
            continue
        if v is None:
            unused += [f for f in e.flags if g.has(f)]
            continue
        values.update(v)
    if wrong:
        raise Refused(f"{len(wrong)} flag{'s' if len(wrong) > 1 else ''} refused:\n  " + "\n  ".join(wrong))
    if "model.vocab_size" not in values:
        notes.append(f"--tokenizer-type {g.get('--tokenizer-type', '(none)')}: the vocabulary comes from the "
                     "tokenizer's files, not the flags; model.vocab_size stays the model preset's (set it if it "
                     "differs)")
    if g.has("--lr") and g.has("--min-lr") and table._float(g.one("--min-lr")) != table._float(g.one("--lr")):
        ignored.append(f"--min-lr {g.one('--min-lr')} (moe_hydra trains at a constant --lr)")
    if g.get("--lr-decay-style", "constant") != "constant":
        ignored.append(f"--lr-decay-style {g.one('--lr-decay-style')} (moe_hydra trains at a constant --lr)")
    if unused:
        notes.append(f"flags that do not apply here, ignored: {', '.join(sorted(set(unused)))}")
    if ignored:
        notes.append(f"ignored (no effect on what moe_hydra plans or measures): {', '.join(ignored)}")
    return values


_KEY = re.compile(r"^\+?([A-Za-z_][\w.]*)=(.*)$", re.DOTALL)
_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")
_WORD = re.compile(r"^[A-Za-z_][\w./-]*$")
_SPECIAL = {"null": None, "true": True, "false": False}


def _scalar(text_: str) -> tuple[bool, Any]:
    """A plain override value read as Hydra's grammar reads it (ints, floats, true/false/null, bare words); (False,
    None) for anything else (lists, quotes, interpolations), which Hydra's own parser reads."""
    low = text_.lower()
    if low in _SPECIAL:
        return True, _SPECIAL[low]
    if _INT.match(text_):
        return True, int(text_)
    if _FLOAT.match(text_):
        return True, float(text_)
    if _WORD.match(text_) and low not in ("inf", "nan", "-inf", "+inf"):
        return True, text_
    if len(text_) >= 2 and text_[0] == text_[-1] == "'" and not any(c in text_[1:-1] for c in "'\\$"):
        return True, text_[1:-1]
    if text_.startswith("[") and text_.endswith("]") and not any(c in text_[1:-1] for c in "[]'\"\\${}"):
        items = [_scalar(i.strip()) for i in text_[1:-1].split(",")] if text_[1:-1].strip() else []
        if all(ok for ok, _ in items):
            return True, [v for _, v in items]
    return False, None


def _overrides(words: list[str]) -> dict[str, Any]:
    """``key=value`` words as {key: value}, read as Hydra reads overrides (its parser for all but plain values: a
    Bridge list holds a hundred, and Hydra's parser takes a fraction of a millisecond for each)."""
    out: dict[str, Any] = {}
    hard = []
    for w in words:
        m = _KEY.match(w)
        ok, v = _scalar(m.group(2)) if m else (False, None)
        if ok:
            out[m.group(1)] = v
        else:
            hard.append(w)
    if hard:
        try:
            out.update({o.key_or_group.lstrip("+"): o.value() for o in codec.parse(hard)})
        except Exception as e:  # noqa: BLE001 - Hydra's parser raises its own error types
            raise Refused(f"the overrides do not read as Hydra overrides: {str(e).splitlines()[0]}") from None
    return out


def _bridge(cmd: text.Command, notes: list[str]) -> dict[str, Any]:
    """The moe_hydra values a Megatron-Bridge override list sets."""
    words = list(cmd.args)
    recipe = None
    if "--recipe" in words:
        i = words.index("--recipe")
        recipe = words[i + 1] if i + 1 < len(words) else None
        del words[i:i + 2]
    flags = [w for w in words if w.startswith("--")]
    if flags:
        raise Refused(f"run_recipe.py options moe_hydra cannot read: {', '.join(flags)}")
    parsed = _overrides(words)
    known = table.bridge_keys()
    unknown = sorted(k for k in parsed if k not in known and not k.startswith(BRIDGE_NOTED))
    if unknown:
        raise Refused(f"cannot map {len(unknown)} key{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
                      "(no moe_hydra setting; remove them to ingest the rest)")
    ignored = sorted(k for k in parsed if k not in known)
    wrong: list[str] = []  # every key refused, said at once
    for key, want, action in table.BRIDGE_FIXED:
        if key in parsed and parsed[key] != want:
            if action == "refuse":
                wrong.append(f"{key}={parsed[key]}: moe_hydra's job runs with {key}={want}")
            else:
                ignored.append(f"{key}={parsed[key]}")
    values: dict[str, Any] = {}
    for e in table.TABLE:
        if e.from_bridge is None:
            continue
        try:
            v = e.from_bridge(parsed)
        except Refused as r:
            wrong.append(str(r))
            continue
        if v:
            values.update(v)
    if wrong:
        raise Refused(f"{len(wrong)} override{'s' if len(wrong) > 1 else ''} refused:\n  " + "\n  ".join(wrong))
    if recipe:
        notes.append(f"--recipe {recipe}: its model provider and settings are not read; what the overrides do not "
                     "set comes from the moe_hydra presets")
    if ignored:
        notes.append(f"ignored (no effect on what moe_hydra plans or measures): {', '.join(ignored)}")
    return values


def ingest(fmt: str, words: list[str] | None = None, source: str | None = None,
           hardware: str | None = None) -> Ingested:
    """The moe_hydra overrides of a command given as ``words`` (argv, or the shell's split of export's text) or as
    ``source`` (a file's text). ``hardware``: the hardware preset (the flags do not name a GPU).

    Raises:
        Refused: one message naming every flag or key that cannot be mapped.
    """
    notes: list[str] = []
    if fmt not in ("megatron-lm", "bridge"):
        raise Refused(f"unknown format {fmt!r}: megatron-lm or bridge")
    try:
        cmd = text.from_text(source) if source is not None else text.from_words(list(words or []))
    except ValueError as e:
        raise Refused(f"cannot read the command: {e}") from None
    values = _megatron_lm(cmd, notes) if fmt == "megatron-lm" else _bridge(cmd, notes)
    if fmt == "bridge" and cmd.launcher:
        launcher, _ = text.parse_flags([w for w in cmd.launcher if w not in text.LAUNCHERS])
        g = Flags({f.replace("_", "-"): v for f, v in launcher.items()
                   if f.replace("_", "-") in ("--nnodes", "--nproc-per-node")})
        values.update(next(e for e in table.TABLE if e.launcher).from_mlm(g) or {})
    choices, lines, header_keys = _header(cmd.header)
    if cmd.header is None:
        if fmt == "megatron-lm":
            values.setdefault("data.seed", values.get("seed", 1234))  # Megatron-LM orders the data by --seed
        choices = _match(values, notes)
        notes.append("no '# moe_hydra:' line: the group choices are the presets the flags match"
                     + ("" if hardware else "; hardware is the default preset (name yours with --hardware NAME)"))
    else:
        for group in NAMED[1:]:  # the model's name is the line's; its fields are the flags'
            if group in choices:
                off = presets.mismatches(group, choices[group], values)
                if off:
                    notes.append(f"{group}={choices[group]} (the '# moe_hydra:' line), with {', '.join(off)} as "
                                 "the flags set them")
    if hardware:
        if "hardware" in choices and choices["hardware"] != hardware:
            notes.append(f"--hardware {hardware} replaces hardware={choices['hardware']} of the '# moe_hydra:' line")
        choices["hardware"] = hardware
        if hardware not in presets.options("hardware"):
            raise Refused(f"--hardware {hardware}: no such preset ({', '.join(presets.options('hardware'))})")
    base = presets.literal(choices, header_keys)
    # the comment line's keys are those the flags could not say: they win over what ingest derived for them
    values = {k: v for k, v in values.items() if k not in {key for key, _ in header_keys}}
    groups = {g for g, _ in presets.defaults()}
    head = [f"hardware={choices['hardware']}" if _key(ln) == "hardware" and "hardware" in choices else ln
            for ln in lines]
    given = {_key(ln) for ln in head}
    out = [f"{g}={c}" for g, c in choices.items() if g in groups and g not in given]
    out += head
    for key, v in values.items():
        if base is not None and presets.same(base.get(key, presets.UNKNOWN), v):
            continue
        out.append(codec.override(key, v))
    out += _environment(cmd.env, base, complete=cmd.header is not None, notes=notes)
    return Ingested(out, notes, values, choices)


def _environment(assignments: list[str], base: dict[str, Any] | None, complete: bool, notes: list[str]) -> list[str]:
    """``NAME=value`` words before the launcher as ``hardware.env`` overrides: set where the presets differ, and
    (``complete``: export's text, whose line is the whole environment) removed where the command has none."""
    from moe_hydra.core.schema import HardwareConfig

    if "env" not in {f for f in HardwareConfig.__dataclass_fields__}:
        if assignments:
            notes.append(f"environment {' '.join(assignments)}: not applied (this moe_hydra has no hardware.env)")
        return []
    given = dict(a.split("=", 1) for a in assignments)
    prefix = export.ENV + "."
    have = None if base is None else {k[len(prefix):]: str(v) for k, v in base.items()
                                        if k.startswith(prefix) and v is not None}
    out = [codec.override(f"++{prefix}{k}", v) for k, v in given.items() if have is None or have.get(k) != v]
    if complete and have is not None:
        out += [f"~{prefix}{k}" for k in have if k not in given]
    elif have and not complete:
        kept = [k for k in have if k not in given]
        if kept:
            notes.append(f"the hardware preset's environment keeps {', '.join(kept)} (not on the command line; "
                         f"drop one with ~{prefix}NAME)")
    return out


def _key(line: str) -> str:
    return line.lstrip("+~").split("=", 1)[0]
