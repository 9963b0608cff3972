"""The hand-off: export a plan as Megatron-LM ``pretrain_gpt.py`` flags and Megatron-Bridge overrides, ingest them
back, get the same contract.

Every ``conf/mesh`` preset x every ``conf/dispatcher`` option x every ``conf/precision`` option (a GPU preset that has
the precision, a world size the mesh fits): every flag written is one Megatron-LM's parser defines at the pinned
commit (``tests/data/megatron_lm_arguments.txt``), with a value it accepts; every Bridge ``model.*`` / ``optimizer.*``
/ ``ddp.*`` key is a field of the installed megatron-core's config dataclasses; export -> ingest -> compose gives the
same contract hash, with the ``# moe_hydra:`` line and without it (flags, ``--hardware`` and preset matching only).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from moe_hydra.core import contract
from moe_hydra.core.env import snapshot
from moe_hydra.core.resolved import resolve
from moe_hydra.core.schema import conf_dir
from moe_hydra.core.versions import mcore_facts
from moe_hydra.core.violations import LayoutError
from moe_hydra.core.errors import Refused
from moe_hydra.handoff import export, ingest, table, text
from moe_hydra.launch.compose import compose_typed
from moe_hydra.planning import rules

ROOT = Path(__file__).resolve().parent.parent
PINNED = ROOT / "tests" / "data" / "megatron_lm_arguments.txt"

# Each mesh preset's model and node count (8 GPUs a node on every GPU preset used here)
MESHES = {"ep8": ("qwen3_30b_a3b", 1), "ep16": ("qwen3_30b_a3b", 2), "dsv3_h100_1024": ("deepseek_v3", 128),
          "qwen3_235b_a22b_h100_256": ("qwen3_235b_a22b", 32), "qwen3_30b_a3b_h100_16": ("qwen3_30b_a3b", 2)}
BLACKWELL_ONLY = {"mxfp8", "nvfp4"}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def combos() -> list[list[str]]:
    out = []
    for mesh in _options("mesh"):
        model, nodes = MESHES[mesh]
        for dispatcher in _options("dispatcher"):
            for precision in _options("precision"):
                hw = "b200" if precision in BLACKWELL_ONLY else "h100_sxm"
                out.append([f"model={model}", f"hardware={hw}", *([f"hardware.nodes={nodes}"] * (nodes > 1)),
                            f"mesh={mesh}", f"dispatcher={dispatcher}", f"precision={precision}"])
    return out


def pinned() -> dict[str, dict]:
    rows = {}
    for line in PINNED.read_text().splitlines():
        if line.startswith("--"):
            flag, kind, dest, nargs, choices, default = line.split("\t")
            rows[flag] = {"kind": kind, "dest": dest, "nargs": nargs,
                          "choices": None if choices == "-" else choices.split("|"), "default": default}
    return rows


@functools.lru_cache(maxsize=1)
def _env() -> dict:
    return snapshot()


class Composer:
    """The composition of the real conf/ (:func:`moe_hydra.launch.compose.compose_typed`), cached by the set of
    overrides."""

    def __init__(self):
        self._cache: dict = {}

    def __call__(self, overrides: list[str]):
        key = tuple(sorted(overrides))
        if key not in self._cache:
            self._cache[key] = compose_typed(overrides)
        return self._cache[key]


@pytest.fixture(scope="module")
def composer():
    return Composer()


def contract_hash(cfg) -> str:
    return contract.hashes(contract.build(cfg, resolve(cfg), _env()), [])["contract_hash"]


def _diff(a, b) -> str:
    ca, cb = contract.build(a, resolve(a), _env()), contract.build(b, resolve(b), _env())
    out = []
    for sec in ca:
        if ca[sec] != cb.get(sec):
            if isinstance(ca[sec], dict):
                out += [f"{sec}.{k}: {ca[sec][k]!r} -> {cb[sec].get(k)!r}" for k in ca[sec]
                        if ca[sec][k] != cb[sec].get(k)]
            else:
                out.append(f"{sec}: {ca[sec]!r} -> {cb.get(sec)!r}")
    return "; ".join(out)


@pytest.fixture(scope="module")
def legal(composer):
    """(overrides, cfg, resolved) of every combination the rules accept, and the count refused."""
    out, refused = [], []
    for ov in combos():
        cfg = composer(ov)
        r = resolve(cfg)
        try:
            rules.validate(r, mcore=mcore_facts())
        except LayoutError:
            refused.append(ov)
            continue
        out.append((ov, cfg, r))
    return out, refused


def test_most_combinations_are_legal(legal):
    ok, refused = legal
    total = len(ok) + len(refused)
    assert total == len(_options("mesh")) * len(_options("dispatcher")) * len(_options("precision"))
    assert len(ok) >= 0.75 * total, f"only {len(ok)} of {total} combinations are legal"


def _check_flag_line(line: list[str], rows: dict) -> list[str]:
    flag, vals = line[0], line[1:]
    if flag not in rows:
        return [f"{flag}: not a flag of Megatron-LM core_v0.16.1"]
    row = rows[flag]
    bad = []
    if row["kind"] in ("store_true", "store_false") and vals:
        bad.append(f"{flag} takes no value, got {vals}")
    if row["kind"] == "value":
        if not vals:
            bad.append(f"{flag} needs a value")
        if row["nargs"] == "1" and len(vals) != 1:
            bad.append(f"{flag} takes one value, got {vals}")
        if row["choices"] and any(v not in row["choices"] for v in vals):
            bad.append(f"{flag} {vals}: not among {row['choices']}")
    return bad


def test_every_flag_is_in_the_pinned_parser_and_every_bridge_key_a_megatron_core_field(legal):
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    fields = {"model": {f.name for f in dataclasses.fields(TransformerConfig)},
              "optimizer": {f.name for f in dataclasses.fields(OptimizerConfig)},
              "ddp": {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}}
    mla = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    rows = pinned()
    bad, flags_seen, keys_seen = [], set(), set()
    for ov, cfg, r in legal[0]:
        x = export.export("megatron-lm", cfg, r, ov)
        for line in x.lines:
            flags_seen.add(line[0])
            bad += [f"{' '.join(ov)}: {b}" for b in _check_flag_line(line, rows)]
        b = export.export("bridge", cfg, r, ov)
        for (o,) in b.lines:
            key = o.split("=", 1)[0]
            keys_seen.add(key)
            section, _, name = key.partition(".")
            allowed = fields.get(section)
            if section == "model" and cfg.model.multi_latent_attention:
                allowed = mla
            if allowed is not None and name not in allowed:
                bad.append(f"{' '.join(ov)}: Bridge key {key} is no field of megatron-core's {section} config")
    assert not bad, "\n".join(sorted(set(bad))[:40])
    assert len(flags_seen) > 60 and len(keys_seen) > 60


def test_launcher_options_are_torchruns(legal):
    ov, cfg, r = legal[0][0]
    x = export.export("megatron-lm", cfg, r, ov)
    launcher = next(line for line in x.text.splitlines() if line.startswith("torchrun")).split()
    assert launcher[-2:] == ["pretrain_gpt.py", "\\"]
    assert {w.split("=")[0] for w in launcher[1:-2]} == {"--nnodes", "--nproc-per-node"}


@pytest.mark.parametrize("fmt", export.FORMATS)
def test_round_trip_gives_the_same_contract_hash(legal, composer, fmt):
    """export -> the shell's word split of its text -> ingest -> compose: the same contract hash; the file form
    reads the same."""
    bad, n = [], 0
    for ov, cfg, r in legal[0]:
        x = export.export(fmt, cfg, r, ov)
        got = ingest.ingest(fmt, words=x.text.split())
        assert ingest.ingest(fmt, source=x.text).overrides == got.overrides
        back = composer(got.overrides)
        if contract_hash(back) != contract_hash(cfg):
            bad.append(f"{' '.join(ov)} -> {' '.join(got.overrides)}: {_diff(cfg, back)}")
        n += 1
    assert not bad, f"{len(bad)} of {n} round trips change the contract:\n" + "\n".join(bad[:10])
    assert n == len(legal[0])


@pytest.mark.parametrize("fmt", export.FORMATS)
def test_round_trip_without_the_comment_line_matches_the_presets(legal, composer, fmt):
    """A user's command has no '# moe_hydra:' line: the group presets are found from the flags (flex + deepep ->
    dispatcher=deepep; the model from its shape), the hardware named with --hardware. For a preset-only config the
    contract comes back the same, names included."""
    bad, n = [], 0
    # every dispatcher x precision on one mesh preset, and every mesh preset once (each a Hydra composition)
    chosen = [c for c in legal[0] if "mesh=ep8" in c[0] or ("dispatcher=deepep" in c[0] and "precision=bf16" in c[0])]
    for ov, cfg, r in chosen:
        x = export.export(fmt, cfg, r, ov)
        words = x.text.split()
        words = words[words.index("torchrun"):]
        got = ingest.ingest(fmt, words=words, hardware=cfg.hardware.name)
        if fmt == "bridge" and cfg.precision.name not in ("bf16", "nvfp4"):
            continue  # the fp8 presets have no equal Bridge recipe, and fp32 no name: nothing says the precision
        back = composer(got.overrides)
        n += 1
        if contract_hash(back) != contract_hash(cfg):
            bad.append(f"{' '.join(ov)} -> {' '.join(got.overrides)}: {_diff(cfg, back)}")
    assert not bad, f"{len(bad)} of {n} round trips change the contract:\n" + "\n".join(bad[:10])
    assert n >= (30 if fmt == "megatron-lm" else 8)


def test_every_entry_reads_back_what_it_writes(legal):
    """Entry by entry, for every legal combination: the flags an entry writes read back to the values it wrote, and
    an entry that does not apply reads as not applying."""
    from moe_hydra.handoff.table import Flags, Source, Unmapped

    bad = []
    for ov, cfg, r in legal[0]:
        s = Source(cfg, r, mcore_facts())
        x = export.export("megatron-lm", cfg, r, ov)
        words = x.text.split()
        cmd = text.from_words(words)
        parsed, _ = text.parse_flags(cmd.args)
        parsed.update(text.parse_flags([w for w in cmd.launcher if w.startswith("--")])[0])
        g = Flags(parsed)
        for e in table.TABLE:
            if not e.flags:
                continue
            v = e.values(s)
            try:
                if v is not None:
                    e.to_mlm(v, s)
            except Unmapped:
                continue
            back = e.from_mlm(g)
            if v is None:
                continue  # not written; whether it reads back is the round trip's business
            if back is None or any(back.get(k) != x_ for k, x_ in v.items()):
                bad.append(f"{e.keys} {' '.join(ov)}: wrote {v}, read {back}")
    assert not bad, "\n".join(bad[:20])


def test_absent_flags_read_as_the_pinned_parser_defaults():
    """What ingest takes for an absent flag is Megatron-LM's default at the pinned commit; a switch is the kind the
    parser defines (store_true: absent is false; store_false: absent is true)."""
    rows = pinned()
    checked = 0
    for e in table.TABLE:
        if e.kind == "switch":
            assert rows[e.flags[0]]["kind"] == ("store_false" if e.absent else "store_true"), e.flags
        elif e.kind == "value":
            want = rows[e.flags[0]]["default"]
            if e.absent is None or e.absent == []:
                assert want in ("None", "''", "[]"), (e.flags, e.absent, want)
            else:
                assert want in (repr(e.absent), repr(str(e.absent))) or float(want) == float(e.absent), (e.flags, want)
        else:
            continue
        checked += 1
    assert checked > 80


def test_an_unknown_flag_is_refused_by_name(legal):
    ov, cfg, r = legal[0][0]
    words = export.export("megatron-lm", cfg, r, ov).text.split()
    with pytest.raises(Refused) as e:
        ingest.ingest("megatron-lm", words=[*words, "--foo-bar", "3", "--manual-gc"])
    assert "--foo-bar" in str(e.value) and "--manual-gc" in str(e.value) and "cannot map 2 flags" in str(e.value)
    with pytest.raises(Refused, match="--hidden-dropout 0.1"):
        ingest.ingest("megatron-lm", words=[*words, "--hidden-dropout", "0.1"])
    with pytest.raises(Refused, match="model.foo_bar"):
        ingest.ingest("bridge", words=["model.num_layers=4", "model.foo_bar=1"])
    noted = ingest.ingest("megatron-lm",
                          words=[*words, "--save", "/ckpt", "--log-throughput", "--lr-warmup-iters", "9"])
    assert any("--save" in n and "--lr-warmup-iters" in n for n in noted.notes)


def test_a_real_command_without_the_comment_line(composer):
    """A hand-written Qwen3-30B command: the model preset found from its shape, flex + deepep named deepep, the
    hardware from --hardware, what Megatron-LM defaults when a flag is absent taken as such."""
    cmd = """
    CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 8 --nnodes 2 --node_rank 0 --master_addr h0 \\
      pretrain_gpt.py --bf16 --num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 32 \\
      --group-query-attention --num-query-groups 4 --kv-channels 128 --seq-length 4096 \\
      --max-position-embeddings 40960 --tokenizer-type NullTokenizer --vocab-size 151935 --normalization RMSNorm \\
      --swiglu --disable-bias-linear --qk-layernorm --untie-embeddings-and-output-weights \\
      --position-embedding-type rope --rotary-base 1000000 --num-experts 128 --moe-ffn-hidden-size 768 \\
      --moe-router-topk 8 --moe-aux-loss-coeff 1e-3 --moe-token-dispatcher-type flex --moe-grouped-gemm \\
      --moe-router-dtype fp32 --expert-model-parallel-size 16 --expert-tensor-parallel-size 1 \\
      --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 1024 --train-iters 500 --lr 3e-4 \\
      --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 50 --mock-data --hidden-dropout 0 \\
      --attention-dropout 0 --save /ckpt --log-interval 10
    """
    got = ingest.ingest("megatron-lm", source=cmd, hardware="h100_sxm")
    assert got.choices["model"] == "qwen3_30b_a3b" and got.choices["dispatcher"] == "deepep", got.overrides
    assert "hardware=h100_sxm" in got.overrides and "hardware.nodes=2" in got.overrides
    assert "train.train_iters=500" in got.overrides and "optimizer.lr=0.0003" in got.overrides
    assert "dispatcher.num_sms=null" in got.overrides  # absent: Megatron-LM's default, not the preset's 20
    assert any("--lr-decay-style cosine" in n for n in got.notes)
    cfg = composer(got.overrides)
    assert cfg.parallel.expert_model_parallel_size == 16 and cfg.model.moe_router_topk == 8
    assert cfg.kernels.cuda_graph_impl == "none" and cfg.precision.name == "bf16"
    assert cfg.kernels.attention_backend == "auto"  # absent: Megatron-LM's default
    # the attention kernels a command chooses are planned as such: the score matrix held and its time
    unfused = ingest.ingest("megatron-lm", source=cmd + " --attention-backend unfused", hardware="h100_sxm")
    assert "kernels.attention_backend=unfused" in unfused.overrides
    assert resolve(composer(unfused.overrides)).impl.attention == "unfused"


def test_export_reports_what_no_flag_carries(composer):
    ov = ["model=qwen3_30b_a3b", "hardware=b200", "mesh=ep8", "kernels.cuda_graph_impl=full_iteration",
          "contract.window=[41,50]", "train.layout_invariant_init=false"]
    cfg = composer(ov)
    x = export.export("megatron-lm", cfg, resolve(cfg), ov)
    assert any("kernels.cuda_graph_impl=full_iteration" in u for u in x.unmapped)
    assert "kernels.cuda_graph_impl=full_iteration" in x.header and "contract.window=[41,50]" in x.header
    assert "train.layout_invariant_init=false" in x.header and "mesh=ep8" in x.header
    assert not any(line[0] == "--cuda-graph-impl" for line in x.lines)
    back = composer(ingest.ingest("megatron-lm", words=x.text.split()).overrides)
    assert contract_hash(back) == contract_hash(cfg)


def test_gpt_oss_clamped_quick_geglu_travels_as_its_megatron_lm_flags(composer):
    ov = ["model=gpt_oss_20b", "hardware=h100_sxm", "mesh=ep8"]
    cfg = composer(ov)
    x = export.export("megatron-lm", cfg, resolve(cfg), ov)
    flags = {line[0]: line[1:] for line in x.lines}
    assert "--quick-geglu" in flags and "--swiglu" not in flags
    assert flags["--activation-func-clamp-value"] == ["7.0"] and flags["--glu-linear-offset"] == ["1.0"]
    words = x.text.split()
    got = ingest.ingest("megatron-lm", words=words[words.index("torchrun"):], hardware="h100_sxm")  # flags alone
    m = composer(got.overrides).model
    assert (m.gated_linear_unit, m.activation_func, m.activation_func_clamp_value, m.glu_linear_offset) == (
        True, "quick_gelu", 7.0, 1.0)
    bridge = export.export("bridge", cfg, resolve(cfg), ov)  # Bridge's activation_func is the provider's function
    assert any("model.activation_func=quick_gelu" in u for u in bridge.unmapped)


@pytest.mark.parametrize("model,flag", [("qwen3_30b_a3b", "--no-bias-swiglu-fusion"),
                                        ("gpt_oss_20b", "--no-bias-gelu-fusion"),  # quick-geglu: Megatron-LM's gelu flag
                                        ("gpt3_175b", "--no-bias-gelu-fusion")])
def test_an_unfused_activation_travels_as_the_flag_of_its_activation(composer, model, flag):
    for fused in (True, False):
        ov = [f"model={model}", "hardware=h100_sxm", f"kernels.bias_activation_fusion={str(fused).lower()}"]
        cfg = composer(ov)
        x = export.export("megatron-lm", cfg, resolve(cfg), ov)
        flags = {line[0] for line in x.lines}
        assert not {"--no-bias-swiglu-fusion", "--no-bias-gelu-fusion"} & flags if fused else flag in flags
        words = x.text.split()
        got = ingest.ingest("megatron-lm", words=words[words.index("torchrun"):], hardware="h100_sxm")
        assert composer(got.overrides).kernels.bias_activation_fusion is fused
        bridge = export.export("bridge", cfg, resolve(cfg), ov)
        assert f"model.bias_activation_fusion={str(fused).lower()}" in bridge.text


def _cli(module: str, *args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, input=stdin, check=False)


def test_the_cli_round_trip_of_the_acceptance_check(tmp_path):
    """plan -> export megatron-lm DIR -> ingest -- $(cat flags) (the shell's word split) -> plan: the same hash."""
    script = f"""
set -e
PY={sys.executable}
T={tmp_path}
$PY -m moe_hydra hydra.run.dir=$T/pl stage=plan model=qwen3_30b_a3b hardware=h100_sxm hardware.nodes=2 \\
    expert_mesh=ep16 dispatcher=deepep > $T/pl.log 2>&1
$PY -m moe_hydra.export megatron-lm $T/pl > $T/flags 2> $T/exp.err
grep -Eq -- '--expert-model-parallel-size[ =]16' $T/flags
$PY -m moe_hydra.ingest megatron-lm -- $(cat $T/flags) > $T/ovr 2> $T/ing.err
mapfile -t ovr < $T/ovr
$PY -m moe_hydra hydra.run.dir=$T/back stage=plan "${{ovr[@]}}" > $T/back.log 2>&1
$PY -m moe_hydra.export bridge $T/pl > $T/bridge
$PY -m moe_hydra.ingest bridge --file $T/bridge > $T/bovr
"""
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "WANDB_MODE": "offline"}, check=False)
    logs = "".join((tmp_path / f).read_text() for f in ("pl.log", "exp.err", "ing.err", "back.log")
                   if (tmp_path / f).exists())
    assert run.returncode == 0, run.stderr + logs
    import json

    h1 = json.loads((tmp_path / "pl" / "plan.json").read_text())["contract_hash"]
    h2 = json.loads((tmp_path / "back" / "plan.json").read_text())["contract_hash"]
    assert h1 == h2
    assert (tmp_path / "bovr").read_text() == (tmp_path / "ovr").read_text()


def test_cli_refusals_exit_2_with_one_message(tmp_path):
    r = _cli("moe_hydra.export", "megatron-lm", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "no .hydra/config.yaml" in r.stderr and not r.stdout
    assert "Traceback" not in r.stderr
    r = _cli("moe_hydra.export", "megatron-lm", "model=qwen3_30b_a3", "hardware=h100_sxm", cwd=tmp_path)
    assert r.returncode == 2 and "qwen3_30b_a3b" in r.stderr and "Traceback" not in r.stderr and not r.stdout
    r = _cli("moe_hydra.export", "megatron-lm", "model=qwen3_30b_a3b", "hardware=h100_sxm", "expert_mesh=ep64",
             cwd=tmp_path)
    assert r.returncode == 2 and "violation" in r.stderr and not r.stdout
    r = _cli("moe_hydra.export", "megatron-lm", "dispatcher=alltoall,deepep", cwd=tmp_path)
    assert r.returncode == 2 and "sweep" in r.stderr
    r = _cli("moe_hydra.ingest", "megatron-lm", "--", "--num-layers", "2", "--frobnicate", cwd=tmp_path)
    assert r.returncode == 2 and "--frobnicate" in r.stderr and "Traceback" not in r.stderr and not r.stdout
    assert len(r.stderr.strip().splitlines()) == 1
    r = _cli("moe_hydra.export", "megatron-lm", "model=qwen3_30b_a3b", "hardware=h100_sxm", "mesh=ep8", cwd=tmp_path)
    assert r.returncode == 0 and "--expert-model-parallel-size 8" in r.stdout
    r2 = _cli("moe_hydra.ingest", "megatron-lm", "--file", "-", cwd=tmp_path, stdin=r.stdout)
    assert r2.returncode == 0 and r2.stdout.splitlines()[:3] == ["model=qwen3_30b_a3b", "hardware=h100_sxm", "mesh=ep8"]


def test_the_layout_search_writes_the_top_layouts_commands(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline"}
    run = subprocess.run([sys.executable, "-m", "moe_hydra", f"hydra.run.dir={tmp_path}/s", "stage=plan",
                          "model=qwen3_30b_a3b", "hardware=h100_sxm", "hardware.nodes=2", "hydra/sweeper=layout",
                          "hydra.sweeper.table_rows=3", "-m"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=180, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    out = tmp_path / "s" / "search" / "export"
    files = sorted(p.name for p in out.iterdir())
    assert files == [f"layout_0{i}.{f}.sh" for i in (1, 2, 3) for f in ("bridge", "megatron-lm")]
    got = ingest.ingest("megatron-lm", source=(out / "layout_01.megatron-lm.sh").read_text())
    assert got.overrides[:2] == ["model=qwen3_30b_a3b", "hardware=h100_sxm"]


@pytest.mark.parametrize("ov", [
    ["model=deepseek_v3", "hardware=h100_sxm", "hardware.nodes=128", "mesh=dsv3_h100_1024", "dispatcher=deepep"],
    ["model=gpt_oss_20b", "hardware=h100_sxm", "mesh=ep8", "dispatcher=hybridep", "recompute=selective",
     "offload=fine_grained", "attention_mesh=cp2"],
    ["model=mixtral_8x7b", "hardware=b200", "mesh=ep8", "precision=mxfp8", "kernels.cuda_graph_impl=transformer_engine",
     "kernels.cuda_graph_scope=[attn]", "attention_mesh=pp4_vpp2"],
])
def test_bridge_model_fields_are_what_the_job_gives_megatron_core(composer, ov):
    """Bridge's model.* values equal the job's TransformerConfig keyword arguments (moe_hydra.job.mcore_args) for
    every field both name: the hand-off says what the job runs."""
    from moe_hydra.core.arch import parse_moe_layer_freq
    from moe_hydra.core.resolved import Implementation
    from moe_hydra.job.mcore_args import transformer_config_kwargs

    cfg = composer(ov)
    r = resolve(cfg, Implementation.of(cfg, gpu=True, te=True, grouped_gemm=False, apex=True, source="test"))
    kw = transformer_config_kwargs(r, mcore_facts(), on_gpu=True)
    b = ingest._overrides([line[0] for line in export.export("bridge", cfg, r, ov).lines])

    def norm(key, v):
        if key == "moe_layer_freq" and v is not None:
            return [int(x) for x in parse_moe_layer_freq(v, cfg.model.num_layers)]
        return None if v in ([], ()) else list(v) if isinstance(v, tuple) else v

    both = [k[len("model."):] for k in b if k.startswith("model.") and k[len("model."):] in kw]
    assert len(both) > 50
    assert {k: norm(k, b["model." + k]) for k in both} == {k: norm(k, kw[k]) for k in both}


def test_the_environment_travels_as_assignments_before_the_launcher(composer, tmp_path):
    ov = ["model=qwen3_30b_a3b", "hardware=b200", "mesh=ep8", "~hardware.env.USE_MNNVL",
          "hardware.env.NCCL_NVLS_ENABLE=1", "+hardware.env.NCCL_IB_HCA='mlx5_0:1,mlx5_1:1'"]
    cfg = composer(ov)
    x = export.export("megatron-lm", cfg, resolve(cfg), ov)
    env_line = x.text.splitlines()[1]
    assert env_line.startswith("TORCH_NCCL_HIGH_PRIORITY=1 ") and "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1" in env_line
    assert "USE_MNNVL" not in env_line and not any("hardware.env" in h for h in x.header)
    (tmp_path / "cmd.sh").write_text(x.text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "cmd.sh")], check=False).returncode == 0
    got = ingest.ingest("megatron-lm", words=x.text.split())
    assert "~hardware.env.USE_MNNVL" in got.overrides
    assert contract_hash(composer(got.overrides)) == contract_hash(cfg)
    # a user's command: what it sets is set, the preset's other variables stay (and stderr says so)
    user = ingest.ingest("megatron-lm", hardware="b200", words=["NCCL_NVLS_ENABLE=1", *x.text.split()[x.text.split()
                                                                  .index("torchrun"):]])
    assert "++hardware.env.NCCL_NVLS_ENABLE='1'" in user.overrides
    assert not any(o.startswith("~hardware.env") for o in user.overrides)
    assert any("keeps" in n and "TORCH_NCCL_HIGH_PRIORITY" in n for n in user.notes)
