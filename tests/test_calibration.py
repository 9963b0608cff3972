"""The measured-runs dataset (benchmarks/data/measured_runs.yaml) and the models judged on it: the step time held out
(leave one source out), memory against the allocator's peak, fit at the published settings, search coverage."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

from moe_hydra.core import overrides
from moe_hydra.core.pipeline import expand_layout
from moe_hydra.planning import search, step_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import step_model_calibration as calibration  # noqa: E402


@pytest.fixture(scope="module")
def data():
    return calibration.load()


@pytest.fixture(scope="module")
def rows(data):
    return calibration.rows(data)


def test_the_dataset_covers_the_models_clusters_and_precisions_with_provenance(data):
    runs = data["runs"]
    assert len(runs) >= 30 and len({r["name"] for r in runs}) == len(runs)
    assert len({r["model"] for r in runs}) >= 6
    assert {"h100", "b200", "gb200", "gb300"} <= {r["gpu"] for r in runs}
    assert {"bf16", "fp8_tensorwise", "mxfp8"} <= {r["precision"] for r in runs}
    for r in runs:
        source = data["sources"][r["source"]]
        assert source["repo"] and source["path"] and source["counter"], r["source"]
        if "/" in source["repo"]:  # an upstream repository: the stored file's commit
            assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), r["source"]
        p = r["published"]
        assert p["step_time_s"] or p["tokens_per_s_per_gpu"] or p["tflops_per_gpu"] or p["memory_gib"], r["name"]


def test_each_rows_overrides_resolve_to_its_published_columns(rows):
    for row in rows:
        r, c = row.r, row.row
        assert r.layout.world_size == c["num_gpus"], row.name
        vpp = c["virtual_pipeline_model_parallel_size"]
        published = (c["tensor_model_parallel_size"], c["context_parallel_size"], c["pipeline_model_parallel_size"],
                     vpp if vpp and vpp > 1 else None, c["expert_model_parallel_size"],
                     c["expert_tensor_parallel_size"] or 1)
        assert (r.layout.tp, r.layout.cp, r.layout.pp, r.layout.vpp, r.layout.ep, r.layout.etp) == published, row.name
        assert (r.batch.micro_batch_size, r.batch.global_batch_size, r.batch.seq_length) == (
            c["micro_batch_size"] or 1, c["global_batch_size"], c["seq_length"]), row.name
        assert row.cfg.hardware.name == calibration.HARDWARE[c["gpu"]][0] and row.cfg.precision.name == c["precision"]
        # and they are what --write-overrides writes from the columns
        assert c["overrides"] == calibration.overrides_of(c, r.arch), row.name
        # the attention kernels the runs used: Megatron-DeepSpeed's (vTrain) materialise the score matrix
        assert r.impl.attention == ("unfused" if c["source"] == "vtrain" or "transformer_engine=false"
                                    in " ".join(c["overrides"]) else "flash"), row.name


def test_every_published_layout_and_recompute_is_one_the_search_generates(rows):
    for row in rows:
        r, cfg = row.r, row.cfg
        lo, p = r.layout, cfg.parallel
        splits = search.pipeline_splits(r.arch, lo.pp, lo.vpp)
        if p.pipeline_model_parallel_layout:
            assert expand_layout(p.pipeline_model_parallel_layout) in [expand_layout(s) for s in splits
                                                                      if s not in ("even", "account")], row.name
        else:
            assert ("account" if p.account_for_embedding_in_pipeline_split else "even") in splits, row.name
        for size in (lo.tp, lo.cp, lo.pp, lo.ep, lo.etp):
            assert lo.world_size % size == 0
        assert lo.vpp is None or 2 <= lo.vpp <= r.arch.num_layers // lo.pp + 1
        if row.row["recompute"] and cfg.recompute.recompute_granularity == "selective":
            s = search.Search(overrides.apply(cfg, ["recompute=none"]))  # the ladder from none, from the presets
            ladder = {tuple(sorted(s.recompute[level].recompute_modules or [])) for level in s.recompute}
            assert tuple(sorted(cfg.recompute.recompute_modules)) in ladder, row.name


def test_no_published_run_is_refused_or_called_unfit_at_its_own_settings(rows):
    planned = [r for r in rows if not r.excluded]
    assert not [r.name for r in planned if r.refused]
    assert not [(r.name, round(r.peak_gib, 1)) for r in planned if not r.fits]


def test_rows_share_a_layout_search_only_where_it_searches_the_same_thing(rows):
    """The search a published layout is ranked in is its own model's: vTrain's GPT-3 39.1B and 175B runs share
    the cluster, batch and precision, and differ in the model's sizes only."""
    by_name = {r.name: r for r in rows}
    b39 = by_name["GPT-3 39.1B A100x512 TP8 PP2 DP32 MBS2 [vTrain]"]
    b175 = by_name["GPT-3 175B A100x512 TP8 PP8 DP8 MBS2 [vTrain]"]
    assert calibration.search_key(b39) != calibration.search_key(b175)
    other_layout = by_name["GPT-3 39.1B A100x512 TP8 PP4 DP16 MBS2 [vTrain]"]  # same search, another layout
    assert calibration.search_key(b39) == calibration.search_key(other_layout)


def test_memory_matches_the_allocators_peak_on_every_measured_row(rows):
    """Against torch.cuda.max_memory_allocated: the Qwen3-30B-A3B slices (torch's Adam holds an fp32 temporary of
    the shard) within 5 %, tiny_moe (two 32 MiB cuBLAS workspaces beside 34 MiB of states) within 15 %."""
    measured = {r.name: (r.peak_gib - r.allowance_gib) / r.row["published"]["memory_gib"] - 1
                for r in rows if r.row["published"].get("memory_gib")}
    assert len(measured) == 3
    assert all(abs(e) <= 0.15 for e in measured.values()), measured
    assert sorted(abs(e) for e in measured.values())[1] <= 0.05, measured  # the median
    assert all(abs(e) <= 0.05 for n, e in measured.items() if "slice" in n), measured


def test_the_held_out_step_time_error_is_what_the_plan_states_and_stays_bounded(rows):
    """Each source's rows predicted by the fractions fitted on the other sources. The bounds guard today's model
    (the goals, median 0.10 / p90 0.22 / worst 0.41, are not met: see benchmarks/step_model_calibration.py);
    HELD_OUT, which plan.json's interval and the search's tie width read, must be what the benchmark measures."""
    timed = [r for r in rows if r.timed]
    k = timed[0].cfg.step_model
    held = calibration.cross_validate(timed, k)
    s = calibration.summary(list(held.values()))
    rank = calibration.ranking_error(timed, held)
    stated = step_model.HELD_OUT
    assert s["rows"] == stated["rows"] and len({r.row["source"] for r in timed}) == stated["sources"]
    for name, value in (("median", s["median"]), ("p90", s["p90"]), ("worst", s["worst"]),
                        ("ranking_median", rank["median"]), ("ranking_p90", rank["p90"])):
        assert value == pytest.approx(stated[name], abs=0.01), name
    assert rank["rows"] == stated["ranking_pairs"]
    for kind, of_kind in calibration.by_kind(timed).items():
        part = calibration.summary([held[r.name] for r in of_kind])
        pairs = calibration.ranking_error(of_kind, held)
        assert part["rows"] == stated[kind]["rows"] and pairs["rows"] == stated[kind]["ranking_pairs"]
        for name in ("median", "p90", "worst"):
            assert part[name] == pytest.approx(stated[kind][name], abs=0.01), (kind, name)
        for name in ("median", "p90"):
            assert pairs[name] == pytest.approx(stated[kind][f"ranking_{name}"], abs=0.01), (kind, name)
    assert s["median"] <= 0.13 and s["p90"] <= 0.36 and s["worst"] <= 1.0
    assert stated["moe"]["median"] <= 0.16 and stated["moe"]["p90"] <= 0.42
    assert stated["dense"]["median"] <= 0.12 and stated["dense"]["p90"] <= 0.21
    # the defaults are the fit on every row: refitting moves no prediction by more than 1 %
    refit = calibration.fit(timed, k)
    assert max(abs(r.error(refit) - r.error(k)) for r in timed) < 0.01
    assert math.exp(stated["ranking_p90"]) == pytest.approx(step_model.tie_width())
