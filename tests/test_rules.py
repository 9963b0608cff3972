"""Every legality rule, broken on purpose: the rule fires, with the message and the fix it must give."""

from __future__ import annotations

import atexit
import dataclasses
import random
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from moe_hydra.core.resolved import resolve
from moe_hydra.core.versions import mcore_facts
from moe_hydra.planning import rules, search
from moe_hydra.planning.rules import LayoutError
from moe_hydra.planning.rules.base import READS, VARIED, Ctx, check_reading
from tests.conftest import compose_config
from tests.data.fixtures import rule_datasets, write_calibration

OLD = mcore_facts("0.16.1")
NEW = mcore_facts("0.19.2")
H100 = "hardware=h100_sxm"  # 8 ranks
DSV3 = ("model=deepseek_v3", H100, "hardware.nodes=128", "mesh=dsv3_h100_1024")

# Megatron indexed datasets the data rules (D) read, written once per session with the standard library.
_DATA_DIR = tempfile.mkdtemp(prefix="moe_hydra_rules_")
atexit.register(shutil.rmtree, _DATA_DIR, True)
DS = rule_datasets(_DATA_DIR)
MEGATRON = ("stage=run", "data.kind=megatron")
# calibration.json files (K01): this CPU's, and one measured with another implementation
CAL = write_calibration(Path(_DATA_DIR) / "cal.json", resolve(compose_config()))
CAL_FLASH = write_calibration(Path(_DATA_DIR) / "cal_flash.json", resolve(compose_config()),
                              implementation={**dataclasses.asdict(resolve(compose_config()).impl), "attention": "flash"})

# (rule, overrides, regex the message must match). Invalid inputs show their arithmetic inline.
CASES = [
    ("S01", ["hardware.arch=tpu"], r"hardware\.arch must be one of cpu, ampere, hopper, blackwell"),
    ("S01", ["dispatcher.moe_token_dispatcher_type=alltoall_seq"], r"moe_token_dispatcher_type must be one of"),
    ("S02", ["train.micro_batch_size=0"], r"train\.micro_batch_size must be within \[1, 16777216\] \(is 0\)"),
    ("L13", ['model.moe_layer_freq="[0]*1+[1]*3"'], r"lists 4 layers but num_layers is 2"),
    # 6 ranks, TP4: 6 % 4 = 2
    ("L01", ["hardware.devices_per_node=6", "attention_mesh=tp4", "expert_mesh=ep1"],
     r"world size 6 is not divisible by TP x CP x PP = 4x1x1 = 4"),
    ("L02", ["hardware.devices_per_node=6", "expert_mesh=ep4"],
     r"world size 6 is not divisible by ETP x EP x PP = 1x4x1 = 4"),
    ("L04", [H100, "parallel.virtual_pipeline_model_parallel_size=2"], r"needs pipeline-model-parallel size > 1"),
    # 16 ranks, PP2: DP = 16/2 = 8, EDP = 16/(8*2) = 1
    ("L05", [H100, "hardware.nodes=2", "attention_mesh=pp2", "expert_mesh=ep8", "parallel.use_tp_pp_dp_mapping=true"],
     r"DP 8 != EDP 1"),
    ("L07", [H100, "optimizer.num_distributed_optimizer_instances=3"], r"DP x CP = 8x1 = 8 is not divisible by .* 3"),
    ("L08", [H100, "expert_mesh=ep4", "optimizer.num_distributed_optimizer_instances=4"],
     r"expert DP 2 is not divisible by the partial DistOpt shard factor 4"),
    ("L09", [H100, "attention_mesh=cp2", "parallel.cp_comm_type=a2a+p2p"], r"a2a\+p2p needs hierarchical"),
    ("L09", [H100, "attention_mesh=cp2", "parallel.hierarchical_context_parallel_sizes=[2,2]"],
     r"\[2, 2\] is 4, not CP 2"),
    ("L10", ["model.num_moe_experts=null", "hardware.devices_per_node=2", "expert_mesh=ep2"],
     r"expert parallelism needs a MoE model"),
    ("L11", ["model=mixtral_8x7b", H100, "hardware.nodes=2", "expert_mesh=ep16"],
     r"8 experts do not split over expert-parallel size 16: 8 % 16 = 8"),
    ("L11", ["model.moe_router_topk=9"], r"moe_router_topk 9 exceeds the 8 experts"),
    ("L34", ["model=gpt_oss_20b", H100, "attention_mesh=tp2", "parallel.expert_tensor_parallel_size=2"],
     r"MoE with biases .* supports ETP 1 only, not ETP 2"),
    ("L14", ["model.num_layers=3", "hardware.devices_per_node=2", "attention_mesh=pp2"],
     r"3 layers are not divisible by pipeline-model-parallel size 2"),
    # 12 layers into PP4 x VPP2 = 8 virtual stages
    ("L15", [H100, "model=mixtral_8x7b", "model.num_layers=12", "attention_mesh=pp4_vpp2"],
     r"12 layers do not split into PP x VPP = 4x2 = 8 virtual stages"),
    ("L16", [*DSV3, "parallel.virtual_pipeline_model_parallel_size=2"],
     r"defines VPP = 32 stages / PP 8 = 4, but VPP is set to 2"),
    ("L16", [*DSV3, "parallel.account_for_loss_in_pipeline_split=true"], r"cannot be combined with uneven stages"),
    ("L17", [*DSV3, 'parallel.pipeline_model_parallel_layout="Et|(tt|)*30tmL"'],
     r"places 62 decoder layers \('t'\), the model has 61"),
    ("L17", [*DSV3, 'parallel.pipeline_model_parallel_layout="Et|(tt|)*30L"'], r"places 0 MTP blocks"),
    ("L17", [*DSV3, 'parallel.pipeline_model_parallel_layout="Ex|(tt|)*30mL"'], r"unknown symbols \['x'\]"),
    ("L17", [*DSV3, 'parallel.pipeline_model_parallel_layout="Et|(tt|)*29ttmL"'], r"31 stages, not a multiple of PP 8"),
    ("L18", [H100, "model.num_layers=4", "attention_mesh=pp2", "parallel.virtual_pipeline_model_parallel_size=2",
             "overlap.overlap_p2p_comm=false"], r"batched p2p needs PP > 2 \(PP is 2\)"),
    # 10 layers - first 1 - last 2 = 7 for 2 middle stages
    ("L20", [H100, "model.num_layers=10", "attention_mesh=pp4", "parallel.num_layers_in_first_pipeline_stage=1",
             "parallel.num_layers_in_last_pipeline_stage=2"], r"leave 7 for 2 middle stages"),
    ("L20", [H100, "model.num_layers=10", "attention_mesh=pp4", "parallel.num_layers_in_first_pipeline_stage=4",
             "parallel.account_for_embedding_in_pipeline_split=true"], r"cannot be combined with account_for"),
    ("L21", [H100, "attention_mesh=cp4", "train.seq_length=100"], r"seq_length 100 must be a multiple of 2 x CP = 8"),
    ("L22", [H100, "attention_mesh=tp4", "train.seq_length=130"], r"130/1 = 130 must be divisible by TP 4"),
    ("L23", ["parallel.sequence_parallel=true"], r"sequence parallelism needs tensor parallelism"),
    ("L24", ["overlap.tp_comm_overlap=true"], r"TP communication overlap needs TP >= 2"),
    ("L25", [H100, "parallel.tensor_model_parallel_size=2"], r"MoE with TP 2 requires sequence parallelism"),
    ("L26", [H100, "attention_mesh=tp8"], r"num_attention_heads 4 must be a multiple of TP 8"),
    ("L27", [H100, "attention_mesh=tp4", "model.num_query_groups=6"], r"num_query_groups 6 must be a multiple or divisor of TP 4"),
    ("L28", [H100, "attention_mesh=tp2", "model.ffn_hidden_size=511"], r"ffn_hidden_size 511 is not divisible by 2"),
    ("L28", [H100, "attention_mesh=tp2", "model.moe_ffn_hidden_size=255"], r"moe_ffn_hidden_size 255 is not divisible by 2"),
    ("L30", [H100, "train.global_batch_size=12"], r"global batch 12 is not divisible by micro batch 4 x DP 8 = 32"),
    # DP 64, MBS 1: 512 / 64 = 8 micro-batches, PP 8 -> fine; 576 / 64 = 9 leaves a group of 1
    ("B01", [*DSV3, "train.micro_batch_size=1", "train.global_batch_size=576"],
     r"needs a multiple of PP micro-batches per step, got 9 \(global batch 576"),
    ("L31", ["kernels.moe_grouped_gemm=true"], r"grouped-GEMM experts need a GPU"),
    ("L32", ["overlap.overlap_param_gather=true"], r"overlap_param_gather needs the distributed optimizer and overlap_grad_reduce"),
    ("L33", ["offload=optimizer", "optimizer.use_distributed_optimizer=false"], r"optimizer CPU offload needs the distributed optimizer"),
    ("S02", ["offload.optimizer_offload_fraction=1.5"], r"optimizer_offload_fraction must be within \[0, 1\] \(is 1\.5\)"),
    ("L35", ["dispatcher.moe_flex_dispatcher_backend=deepep"], r"backend deepep is only used by the flex dispatcher"),
    ("L38", [H100, "mesh=ep8", "dispatcher=deepep", "dispatcher.moe_flex_dispatcher_backend=null"], r"flex dispatcher needs a backend"),
    ("L40", ["dispatcher=deepep"], r"flex dispatcher \(deepep\) needs ETP x EP > 1; it is 1x1"),
    ("L37", [H100, "mesh=ep8", "dispatcher=deepep", "routing.moe_expert_capacity_factor=1.0",
             "routing.moe_pad_expert_input_to_capacity=true"], r"DeepEP does not support padding"),
    ("L37", ["routing.moe_pad_expert_input_to_capacity=true"], r"needs moe_expert_capacity_factor"),
    ("L44", ["routing.moe_router_padding_for_quantization=true"], r"needs fp8/fp4"),
    ("L45", ["overlap.moe_shared_expert_overlap=true"], r"moe_shared_expert_overlap needs shared experts"),
    ("L47", ["model.moe_router_topk=1"], r"top-1 routing with softmax needs moe_router_pre_softmax"),
    ("L48", ["model.moe_router_num_groups=3", "model.moe_router_group_topk=1"], r"8 experts do not split into 3 routing groups"),
    ("L48", ["model.moe_router_num_groups=2", "model.moe_router_group_topk=4"], r"moe_router_group_topk <= moe_router_num_groups \(2\)"),
    ("L49", ["model.moe_router_enable_expert_bias=true"], r"expert bias needs the sigmoid"),
    ("L50", ["recompute=full", "recompute.recompute_method=null"], r"full recompute needs recompute_method"),
    ("L50", ["recompute=full", "recompute.recompute_num_layers=5"], r"recompute_num_layers 5 must be between 1 and .* \(2\)"),
    ("L50", ["recompute=none", "recompute.recompute_num_layers=1"], r"apply to full recompute only"),
    ("L51", ["recompute=selective", "recompute.recompute_modules=[core_atn]"], r"unknown recompute modules \['core_atn'\]"),
    ("L52", ["recompute=selective"], r"moe_act recompute needs grouped-GEMM experts"),
    ("L52", [H100, "recompute=selective", "recompute.recompute_modules=[mla_up_proj]"], r"mla_up_proj recompute needs multi-latent"),
    ("L53", ["model=deepseek_v2_lite", H100, "recompute=selective", "recompute.recompute_modules=[shared_experts]",
             "overlap.moe_shared_expert_overlap=true"], r"shared_experts recompute cannot work with moe_shared_expert_overlap"),
    ("L54", [H100, "precision=fp8_delayed", "recompute=selective"], r"delayed scaling does not support moe_act or layernorm"),
    ("L56", ["offload=fine_grained", "offload.offload_modules=[]"], r"needs offload_modules"),
    ("L56", ["offload=fine_grained", "offload.offload_modules=[expert_fc2]"], r"unknown offload modules \['expert_fc2'\]"),
    ("L56", ["offload=fine_grained", "offload.offload_modules=[attn_proj]"], r"attn_proj cannot be offloaded without core_attn"),
    ("L57", ["kernels.cuda_graph_impl=local"], r"CUDA graphs need a GPU"),
    ("L57", [H100, "kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[moe]"], r"'moe' graph scope needs static shapes"),
    ("L58", [H100, "kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[moe,moe_router]"], r"mutually exclusive"),
    ("L59", [H100, "kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[moe_preprocess]"], r"needs 'moe_router'"),
    ("L60", [H100, "recompute=full", "kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[moe_router]"],
     r"full recompute works only with a full-iteration CUDA graph"),
    ("L61", [H100, "kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[moe_router]", "recompute=selective",
             "recompute.recompute_modules=[moe]"], r"MoE recompute conflicts with the TE 'moe_router' graph scope"),
    ("L74", [H100, "kernels.attention_backend=local"], r"attention_backend=local needs the local layer spec"),
    ("S01", ["kernels.attention_backend=sdpa"], r"kernels\.attention_backend must be one of auto, flash, fused"),
    ("L65", [H100, "overlap.overlap_moe_expert_parallel_comm=true"], r"EP overlap needs EP > 1"),
    ("L66", [H100, "mesh=ep8", "dispatcher=allgather", "overlap.overlap_moe_expert_parallel_comm=true"], r"alltoall or flex"),
    ("L67", [H100, "attention_mesh=pp2", "expert_mesh=ep4", "overlap.overlap_moe_expert_parallel_comm=true"], r"PP > 1 needs VPP"),
    ("L68", [H100, "mesh=ep8", "recompute=full", "overlap.overlap_moe_expert_parallel_comm=true"], r"cannot run with full recompute"),
    ("L69", [H100, "mesh=ep8", "precision=fp32", "overlap.overlap_moe_expert_parallel_comm=true"], r"needs BF16 or FP16"),
    ("L70", ["model=deepseek_v2_lite", H100, "mesh=ep8", "overlap.overlap_moe_expert_parallel_comm=true",
             "overlap.moe_shared_expert_overlap=true"], r"mutually exclusive"),
    ("L71", [H100, "mesh=ep8", "model.mtp_num_layers=2", "overlap.overlap_moe_expert_parallel_comm=true"], r"at most one MTP block"),
    ("L72", [H100, "mesh=ep8", "kernels.cuda_graph_impl=transformer_engine", "kernels.cuda_graph_scope=[mlp]",
             "overlap.overlap_moe_expert_parallel_comm=true"], r"TE CUDA-graph scope on moe or mlp"),
    ("L73", ["overlap.delay_wgrad_compute=true"], r"delay_wgrad_compute needs EP overlap"),
    ("L67", [H100, "model=deepseek_v3", "hardware.nodes=8", "parallel.pipeline_model_parallel_size=8",
             "parallel.pipeline_model_parallel_layout='Ettttttt|(tttttttt|)*6ttttttmL'", "expert_mesh=ep8",
             "overlap.overlap_moe_expert_parallel_comm=true"], r"PP > 1 needs VPP"),
    ("O01", ["optimizer.main_grads_dtype=bf16"], r"main_grads_dtype can only be fp32 without the precision-aware"),
    ("P01", ["precision=fp8_tensorwise"], r"runs on hopper or blackwell GPUs, not on local_cpu \(cpu\)"),
    ("P01", [H100, "precision=mxfp8"], r"precision mxfp8 \(mxfp8\) runs on blackwell GPUs, not on h100_sxm"),
    ("P01", ["hardware=h200_sxm", "precision=nvfp4"], r"runs on blackwell GPUs, not on h200_sxm"),
    ("P01", [H100, "precision.fp8=e4m3"], r"fp8 needs an fp8_recipe"),
    ("C01", ["contract.window=[2,10]"], r"starts at step 2, inside the 3 warmup steps"),
    ("C01", ["contract.window=[8,5]", "train.train_iters=10"], r"\[8,5\] ends before it starts"),
    ("C01", ["contract.window=[4,10]", "train.train_iters=5"], r"ends at step 10, after the run's 5 steps"),
    ("S02", ["contract.window=[4,5,6]"], r"contract\.window must be a list of 2 integers or auto"),
    ("S02", ["contract.window=warm"], r"contract\.window must be a list of 2 integers or auto"),
    ("C01", ["contract.window=auto", "train.train_iters=20"], r"auto judges at least 2 x 10 steps"),
    ("C02", ["profile=window", "contract.window=auto", "profile.steps=[30,34]"], r"window is found while the run"),
    ("C02", ["profile=window", "contract.window=[4,10]", "profile.steps=[2,6]"], r"starts at step 2, inside the 3 warmup steps"),
    ("C02", ["profile=window", "contract.window=[4,10]", "profile.steps=[9,7]"], r"\[9,7\] end before they start"),
    ("C02", ["profile=window", "contract.window=[4,10]", "profile.steps=[12]"], r"must be \[first, last\]"),
    ("C02", ["profile=window", "profile.tool=nsys"], r"nsys traces CUDA; this run has no GPU"),
    ("V01", [H100, "attention_mesh=tp2", "expert_mesh=ep1"], r"on megatron-core 0\.16\.1, TP 2 with ETP 1 != TP and EP 1"),
    # planned, searched and fitted, but the job feeds every CP rank whole sequences
    ("J01", ["stage=run", "hardware.devices_per_node=2", "attention_mesh=cp2"],
     r"does not split sequences over context-parallel ranks \(CP 2\)"),
    ("J02", ["stage=run", "optimizer.optimizer=muon"], r"Muon is planned and searched, not run"),
    ("P01", ["precision.fp8_param_gather=true"], r"fp8_param_gather keeps FP8 weights, so it needs an fp8 recipe"),
    ("P01", [H100, "precision.fp8_dot_product_attention=true"], r"fp8_dot_product_attention .* needs an fp8 recipe"),
    ("P01", [H100, "precision=fp8_tensorwise", "precision.fp8_dot_product_attention=true",
             "kernels.attention_backend=unfused"], r"fused attention \(precision fp8_tensorwise, attention unfused\)"),
    # data (D): the blend and split anywhere; the files for stage=run
    ("D01", ["data.kind=megatron"], r"data\.kind=megatron needs data\.path"),
    ("D01", [f"data.path=[{DS['bytes']}]"], r"data\.path is read by data\.kind=megatron only"),
    ("D02", ["data.kind=megatron", f"data.path=[0.3,{DS['bytes']},{DS['one_doc']}]"], r"mixes weights and prefixes"),
    ("D02", ["data.kind=megatron", f"data.path=[0,{DS['bytes']},0,{DS['one_doc']}]"], r"weights .* not all zero"),
    ("D03", ["data.kind=megatron", f"data.path=[{DS['bytes']}]", 'data.split="0,1,0"'],
     r"must give the train split a positive share"),
    ("D04", [*MEGATRON, "data.path=[/nonexistent/moe_hydra/ds]"], r"/nonexistent/moe_hydra/ds\.bin and .*\.idx not found"),
    ("D05", [*MEGATRON, f"data.path=[{DS['corrupt']}]"], r"is not a Megatron-Core indexed dataset index: it does not "
     r"start with the magic"),
    ("D05", [*MEGATRON, f"data.path=[{DS['mismatch']}]"], r"the two files are not one dataset"),
    ("D06", [*MEGATRON, f"data.path=[{DS['bytes']}]", "model.vocab_size=200"],
     r"258-token vocabulary .* larger than model\.vocab_size=200"),
    ("D06", [*MEGATRON, f"data.path=[{DS['wide']}]"], r"holds token id 2000 .* not below model\.vocab_size=1024"),
    ("D07", [*MEGATRON, f"data.path=[{DS['one_doc']}]", 'data.split="1,1,0"'],
     r"leaves the train split none of the 1 document"),
    # no TE: Megatron-Core's CheckpointWithoutOutput calls TE's FP8 state whatever the precision (seen on this CPU)
    ("L75", ["recompute=selective", "recompute.recompute_modules=[core_attn,layernorm]"],
     r"layernorm recompute needs Transformer Engine"),
    # calibration (K): a file that is none, another device kind, another implementation
    ("K01", ["hardware.calibration=/nonexistent/calibration.json"], r"calibration\.json: not readable"),
    ("K01", [f"hardware.calibration={DS['bytes']}.tokenizer.json"], r"not a calibration\.json"),
    ("K01", [H100, f"hardware.calibration={CAL}"], r"was measured on x86_64 \(hardware=h100_sxm is H100"),
    ("K01", [f"hardware.calibration={CAL_FLASH}"], r"another implementation: attention \('flash' calibrated, "
     r"'unfused' here\)"),
]


def violations(overrides, mcore=OLD):
    """The rules' violations, or the sizes the resolved plan refuses when it is built (S02)."""
    try:
        r = resolve(compose_config(*overrides))
    except LayoutError as e:
        return e.violations
    return rules.check(r, mcore)


@pytest.mark.parametrize("rule_id,overrides,pattern", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_with_its_message(rule_id, overrides, pattern):
    found = violations(overrides)
    mine = [v for v in found if v.rule == rule_id]
    assert mine, f"{rule_id} did not fire; got {[v.rule for v in found]}"
    assert any(re.search(pattern, v.message) for v in mine), [v.message for v in mine]
    for v in mine:
        assert v.fix and v.fields, f"{rule_id} must name its fields and a fix"


def test_every_rule_in_the_module_has_a_case():
    source = "".join(p.read_text() for p in Path(rules.__file__).parent.glob("*.py"))
    declared = set(re.findall(r'V\("([A-Z]\d\d)"', source))
    tested = {c[0] for c in CASES}
    assert declared - tested == set(), f"rules without a test: {sorted(declared - tested)}"


@pytest.mark.parametrize("overrides", [
    [],
    [H100, "mesh=ep8", "dispatcher=deepep"],
    [H100, "attention_mesh=tp2", "expert_mesh=ep4"],
    ["hardware.devices_per_node=2", "attention_mesh=tp2", "expert_mesh=ep2"],
    [H100, "recompute=selective", "precision=fp8_blockwise"],
    [H100, "kernels.attention_backend=unfused"],
    [H100, "hardware.transformer_engine=false", "kernels.attention_backend=local"],
    ["kernels.attention_backend=local"],
    [H100, "mesh=ep8", "overlap.overlap_moe_expert_parallel_comm=true", "overlap.delay_wgrad_compute=true"],
    ["model=qwen3_30b_a3b", "hardware=gb200_nvl72", "hardware.nodes=4", "mesh=ep16", "precision=mxfp8", "dispatcher=hybridep"],
])
def test_valid_configs_have_no_violation(overrides):
    assert violations(overrides) == []


def test_all_violations_are_reported_at_once():
    found = {v.rule for v in violations([H100, "attention_mesh=tp8", "expert_mesh=ep1", "dispatcher=deepep",
                                         "precision=mxfp8", "contract.window=[2,10]"])}
    # TP8 > 4 heads; ETP1 x EP1 leaves flex nothing to dispatch over; mxfp8 is Blackwell-only; step 2 is warmup
    assert {"L26", "L40", "P01", "C01"} <= found


def test_ep_fix_lists_the_values_that_work():
    (v,) = [v for v in violations(["model=mixtral_8x7b", H100, "hardware.nodes=2", "expert_mesh=ep16"]) if v.rule == "L11"]
    assert "1, 2, 4, 8" in v.fix and "expert_model_parallel_size" in v.fix
    assert dict(v.fields) == {"model.num_moe_experts": 8, "parallel.expert_model_parallel_size": 16}


def test_version_dependent_rule_follows_the_release():
    overrides = [H100, "attention_mesh=tp2", "expert_mesh=ep1"]
    assert "V01" in {v.rule for v in violations(overrides, OLD)}
    assert "V01" not in {v.rule for v in violations(overrides, NEW)}
    # 0.19 lets shared-expert overlap run on flex; 0.16.1 only on alltoall
    flex = ["model=deepseek_v2_lite", H100, "mesh=ep8", "dispatcher=deepep", "overlap.moe_shared_expert_overlap=true"]
    assert "L45" in {v.rule for v in violations(flex, OLD)}
    assert "L45" not in {v.rule for v in violations(flex, NEW)}


def test_layout_error_report_names_every_violation():
    cfg = compose_config("model=mixtral_8x7b", "expert_mesh=ep16")
    with pytest.raises(LayoutError) as e:
        rules.validate(resolve(cfg), mcore=OLD)
    text = str(e.value)
    assert text.startswith("2 layout violations for mixtral_8x7b on 1 x local_cpu; nothing was launched.")
    assert "[L02]" in text and "[L11]" in text and "fix: " in text


# ----------------------------------------------------------------------------- what each kind of rule reads

def _reads(rule, r) -> set[str]:
    return check_reading(rule, r, NEW)[1]


def _plans():
    """Resolved plans that take the rules through their branches: every rule's failing case, and candidates of
    searches at each recompute level and communication setting."""
    for _, overrides, _ in CASES:
        try:
            yield resolve(compose_config(*overrides))
        except LayoutError:
            continue  # refused by the resolved plan itself (S02)
    rng = random.Random(0)
    for overrides in (("hardware.devices_per_node=8", "model.num_layers=4", "model.mtp_num_layers=1"),
                      ("model=qwen3_30b_a3b", H100, "hardware.nodes=2")):
        s = search.Search(compose_config("stage=plan", *overrides), dispatchers=["alltoall", "deepep"],
                          ep_overlap=[False, True])
        for c in rng.sample(list(search.enumerate_layouts(s.base)), 150):
            for level in s.recompute:
                yield s.resolved(c, level, rng.choice(s.comms))


def test_every_rule_reads_only_what_its_kind_declares():
    """The layout search caches each kind of rule by the values at its declared paths (cache_key); a rule
    that read a varied path its kind does not list would be served another candidate's verdict."""
    undeclared: dict[str, set[str]] = {}
    for r in _plans():
        for rule in rules.RULES:
            declared = set(READS[rule.reads]) | set(rule.comm)
            varied = {p for p in _reads(rule, r) if p.startswith(VARIED)}
            if varied - declared:
                undeclared.setdefault(f"{rule.__name__} (reads={rule.reads})", set()).update(varied - declared)
    assert not undeclared, undeclared


def test_the_recorder_sees_a_rules_reads():
    """The check above, checked: a rule that reads the micro batch and the tensor-parallel size is seen to."""
    def probe(c):
        if c.cfg.train.micro_batch_size and c.layout.tp:
            yield from ()

    assert _reads(probe, resolve(compose_config())) == {"cfg.train.micro_batch_size", "layout.tp"}
