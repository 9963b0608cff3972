"""The step-time and memory models against measured runs (benchmarks/data/measured_runs.yaml), judged held out.

Each row of the dataset is a published or measured run, planned as ``stage=plan`` plans it and compared with its
measured step time (:mod:`moe_hydra.planning.calibration`, which holds the rows, the fit and the held-out scheme).

**Held out.** The free fractions of ``step_model`` (``calibration.FREE``) are fitted (scipy least squares on log
step time, within physical bounds, the hardware rates held near what kernels are measured at, ``calibration.PRIOR``,
the better of two starts) on every source but one and judged on the rows of the one left out, for each source in
turn (leave one source out: a source is one release's table, so the other releases of the same recipes stay in the
fit), then once more leaving one model out. Printed: each row's held-out prediction and error, median / 90th
percentile / worst |ln(predicted / measured)|, the ranking error between rows of one model, cluster and source and
how well their order is predicted (the tie ratio, ``calibration.order_width``), the measured coverage of the 80 % and
90 % intervals leaving each source out with their median width (``calibration.intervals``), and the memory rows
(estimate without the declared allowance vs the allocator's peak).

    python benchmarks/step_model_calibration.py                    # the report (held-out errors)
    python benchmarks/step_model_calibration.py --fit              # also the fit on every row: the defaults
    python benchmarks/step_model_calibration.py --fit --write      # ... recorded in moe_hydra/core/step_model_fit.json
    python benchmarks/step_model_calibration.py --search           # also the search's rank of each published layout
    python benchmarks/step_model_calibration.py --write-overrides  # each row's overrides from its table columns

``--write`` records the fit on every row (the schema's defaults, 3 significant digits), the held-out figures
(``plan.json``'s interval, the search's tie width), the spot checks and the fingerprint of the code and data they
come from in ``moe_hydra/core/step_model_fit.json``; tests/test_calibration.py fails until it is rerun after a change
to them. ``--write-overrides`` rewrites the ``overrides`` of every row from its columns (model, GPUs, precision,
sizes, dispatcher, recompute, CUDA graphs, recipe settings under ``other``) plus its ``extra_overrides``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import yaml

from moe_hydra.core import overrides, step_model_fit
from moe_hydra.launch.compose import compose_typed
from moe_hydra.planning import calibration, search
from moe_hydra.planning.calibration import DATA, FREE, Row, by_kind, cross_validate, fit, ranking_error, summary


def write_overrides(path: Path = DATA) -> None:
    """Rewrite every row's ``overrides`` from its columns, keeping the file's header comment."""
    text = path.read_text()
    header = "".join(line for line in text.splitlines(keepends=True)[:_header_lines(text)])
    data = yaml.safe_load(text)
    for row in data["runs"]:
        row["overrides"] = calibration.overrides_of(row, compose_typed)
    body = yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=True)
    path.write_text(header.rstrip("\n") + "\n\n\n" + body)


def _header_lines(text: str) -> int:
    lines = text.splitlines()
    return next(i for i, line in enumerate(lines) if line and not line.startswith("#"))


# ---------------------------------------------------------------------------------------------- evaluation

LABEL = {"moe": "MoE", "dense": "dense"}


def workloads(timed: list[Row]) -> dict[tuple, list[Row]]:
    """The rows of one source's workload (model shape, cluster, batch, sequence): the layouts it measured of it."""
    groups: dict[tuple, list[Row]] = {}
    for r in timed:
        groups.setdefault((r.row["source"], r.row["model"], *(r.row.get("extra_overrides") or ()), r.row["gpu"],
                           r.row["num_gpus"], r.row["seq_length"], r.row["global_batch_size"]), []).append(r)
    return groups


def chosen(timed: list[Row]) -> set[str]:
    """The rows whose layout their source chose for the workload: a recipe (alone in its workload) or the fastest
    of the layouts a source measured of it. The others were measured to be compared, slower by design: vTrain's
    sweeps measured up to 47 layouts of one workload, so at most 10 of them can be in any top 10."""
    return {min(g, key=lambda r: r.measured).name for g in workloads(timed).values()}


def group_choices(timed: list[Row], errors: dict[str, float]) -> list[dict[str, Any]]:
    """Where one source measured several layouts of one workload (model, cluster, batch, sequence): is the measured
    best among the three predicted fastest (held out), and how much slower is the predicted best than the measured
    best?"""
    out = []
    for key, g in workloads(timed).items():
        if len(g) < 2:
            continue
        predicted = sorted(g, key=lambda r: r.measured * math.exp(errors[r.name]))
        best = min(g, key=lambda r: r.measured)
        out.append({"group": " ".join(map(str, key)), "rows": len(g), "best_in_top3": best in predicted[:3],
                    "predicted_best_slower": predicted[0].measured / best.measured - 1})
    return out


def search_ranks(timed: list[Row]) -> dict[str, tuple[int | None, bool]]:
    """Row name -> (the rank the layout search gives its published layout (TP, CP, PP, VPP, EP, ETP at its micro
    batch), whether it is in the set tied with the best), searching its model, cluster, batch and precision with the
    recompute ladder from none and the dispatchers and EP overlap the layout sweeper tries; rank None when the
    search does not rank it."""
    out: dict[str, tuple[int | None, bool]] = {}
    cache: dict[tuple, tuple[dict[tuple, int], int]] = {}
    for row in timed:
        cfg = overrides.apply(row.cfg, ["recompute=none"])
        key = calibration.search_key(row)
        if key not in cache:
            flex = cfg.hardware.flex_dispatcher
            overlap = cfg.overlap.overlap_moe_expert_parallel_comm  # the sweeper's: the configured one first
            s = search.Search(cfg, dispatchers=list(dict.fromkeys([cfg.dispatcher.name, *([flex] if flex else [])])),
                              ep_overlap=[overlap, not overlap])
            ranks: dict[tuple, int] = {}
            ranked = sorted((res for res in s.run() if res.rank), key=lambda res: res.rank)
            for res in ranked:
                lo = res.layout
                ranks.setdefault((lo.tp, lo.cp, lo.pp, lo.vpp, lo.ep, lo.etp), res.rank)
            cache[key] = (ranks, len(search.tied_set(ranked, s.tie_width)))
        lo = row.r.layout
        ranks, tied = cache[key]
        rank = ranks.get((lo.tp, lo.cp, lo.pp, lo.vpp, lo.ep, lo.etp))
        out[row.name] = (rank, rank is not None and rank <= tied)
    return out


# ---------------------------------------------------------------------------------------------- report

def report(all_rows: list[Row], held: dict[str, float]) -> None:
    print(f"{'row':64s} {'measured s':>10s} {'held-out s':>10s} {'error':>7s}  fits  from")
    for r in all_rows:
        if r.refused or r.excluded:
            print(f"{r.name:64s} {'excluded: ' + r.excluded if r.excluded else 'refused: ' + '; '.join(r.refused)}")
        elif r.timed:
            e = held[r.name]
            print(f"{r.name:64s} {r.measured:10.3f} {r.measured * math.exp(e):10.3f} {math.exp(e) - 1:+7.1%}  "
                  f"{'yes' if r.fits else 'NO ':4s}  {r.measured_from}")
    unfit = [r.name for r in all_rows if not r.refused and not r.excluded and not r.fits]
    print(f"\ncalled unfit at their own settings: {len(unfit)} {unfit}")
    refused = [r.name for r in all_rows if r.refused]
    print(f"refused by the rules: {len(refused)} {refused}")
    memory_rows(all_rows)


def memory_rows(all_rows: list[Row]) -> list[tuple[str, float, float]]:
    """(row, estimate without the allowance, measured) GiB for the rows that publish a peak."""
    out = []
    for r in all_rows:
        measured = r.row["published"].get("memory_gib")
        if measured and not r.refused:
            est = r.peak_gib - r.allowance_gib
            out.append((r.name, est, measured))
            print(f"memory {r.name:56s} estimate {est:8.3f} GiB  measured {measured:8.3f} GiB  "
                  f"{est / measured - 1:+6.1%}  ({r.row['published'].get('memory_counter')})")
    return out


def _share(x: float | None) -> str:
    return "none" if x is None else f"{x:.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="also fit on every row and print the fractions")
    ap.add_argument("--write", action="store_true",
                    help="with --fit: record the fit, the held-out figures and the fingerprint in "
                         f"moe_hydra/core/{step_model_fit.FILE}")
    ap.add_argument("--write-overrides", action="store_true", help="rewrite each row's overrides from its columns")
    ap.add_argument("--search", action="store_true", help="also rank each published layout by the layout search")
    args = ap.parse_args()
    if args.write and not args.fit:
        ap.error("--write records the fit: give --fit too")
    if args.write_overrides:
        write_overrides()
        print(f"rewrote the overrides of {len(calibration.load()['runs'])} rows in {DATA}")
        return
    all_rows = calibration.rows(compose_typed)
    timed = [r for r in all_rows if r.timed]
    k = all_rows[0].cfg.step_model
    held = cross_validate(timed, k)
    report(all_rows, held)
    s = summary(list(held.values()))
    print(f"\nheld out, leave one source out ({len({r.row['source'] for r in timed})} sources, {s['rows']} rows): "
          f"median |ln| {s['median']:.3f}, p90 {s['p90']:.3f}, worst {s['worst']:.3f}")
    kinds = by_kind(timed)
    parts = [(LABEL[kind], of_kind) for kind, of_kind in kinds.items()] + [
        ("rows whose recipe settings the source gives", [r for r in timed if not r.settings_guessed]),
        ("rows whose dispatcher and recipe settings are not known (planned with moe_hydra's defaults)",
         [r for r in timed if r.settings_guessed])]
    for label, part_rows in parts:
        part = summary([held[r.name] for r in part_rows])
        print(f"  of which {label}: {part['rows']} rows, median |ln| {part['median']:.3f}, "
              f"p90 {part['p90']:.3f}, worst {part['worst']:.3f}")
    by_model = summary(list(cross_validate(timed, k, group=lambda r: r.row["model"]).values()))
    print(f"held out, leave one model out: median |ln| {by_model['median']:.3f}, p90 {by_model['p90']:.3f}, "
          f"worst {by_model['worst']:.3f}")
    rank = ranking_error(timed, held)
    print(f"ranking (pairs of one model, cluster and source, held out): {rank['rows']} pairs, median |ln| "
          f"{rank['median']:.3f}, p90 {rank['p90']:.3f}")
    for kind, of_kind in kinds.items():
        part = ranking_error(of_kind, held)
        print(f"  of which {LABEL[kind]}: {part['rows']} pairs, median |ln| {part['median']:.3f}, "
              f"p90 {part['p90']:.3f}")
    for kind, order in calibration.ordering(timed, held).items():
        print(f"  ordering of {LABEL[kind]} pairs ({order['of']}): {order['wrong']} of {order['pairs']} ordered wrong; "
              f"spread {order['sigma']:.3f} (95 % upper {order['sigma_upper']:.3f}): tied below "
              f"x{order['tie_ratio']:.3f}, where the pairs predicted further apart were ordered wrong in "
              f"{_share(order['wrong_apart'])}, the closer ones in {_share(order['wrong_within'])}")
    for coverage in (0.8, 0.9):
        for kind, iv in calibration.intervals(timed, held, coverage).items():
            print(f"{coverage:.0%} interval of {LABEL[kind]} rows ({iv['of']}, {iv['sources']} sources, each weighing "
                  f"the same): x/exp({iv['log_width']:.3f}); leaving each source out it held "
                  f"{iv['held_out_coverage']:.1%} of the rows (worst {iv['worst_source']} "
                  f"{iv['by_source'][iv['worst_source']]:.1%}), median width (high / low) x{iv['median_width']:.2f}")
            print("    " + ", ".join(f"{src} {share:.0%}" for src, share in iv["by_source"].items()))
            for arch, a in iv["by_arch"].items():
                own = a["own"]
                print(f"    on {arch} ({a['kind']['rows']} rows): it held {a['kind']['held_out_coverage']:.1%} (worst "
                      f"{a['kind']['worst_source']} {a['kind']['by_source'][a['kind']['worst_source']]:.0%})"
                      + (f"; its own x/exp({own['log_width']:.3f}) held {own['held_out_coverage']:.1%} (worst "
                         f"{own['worst_source']} {own['by_source'][own['worst_source']]:.0%}), median width "
                         f"x{own['median_width']:.2f}" if own else "; too few sources for its own")
                      + f": plans use the {'generation' if a['uses'] == 'own' else 'kind'}'s")
    choices = group_choices(timed, held)
    print(f"layout choices ({len(choices)} groups of one source, model and cluster, held out): measured best in the "
          f"predicted top 3 in {sum(c['best_in_top3'] for c in choices)}; predicted best within 5 % of the measured "
          f"best in {sum(c['predicted_best_slower'] <= 0.05 for c in choices)}")
    for c in choices:
        print(f"  {c['group']:40s} {c['rows']} rows  best in top 3: {c['best_in_top3']}  "
              f"predicted best slower by {c['predicted_best_slower']:+.1%}")
    if args.search:
        ranks = search_ranks([r for r in timed if r.cfg.hardware.arch != "cpu"])
        best = chosen(timed)
        for label, names in (("every row", list(ranks)), ("chosen by their source", [n for n in ranks if n in best])):
            top10 = sum(1 for n in names if ranks[n][0] is not None and ranks[n][0] <= 10)
            tied = sum(ranks[n][1] for n in names)
            print(f"published layouts in the search's top 10, {label}: {top10} of {len(names)}; in the tied set "
                  f"screening measures: {tied}")
        print("ranks (= tied): " + ", ".join(f"{v}{'=' if t else ''}" for v, t in ranks.values()))
    prior = summary([r.error(k) for r in timed])
    print(f"defaults on every row (in-sample for what they were fitted to): median |ln| {prior['median']:.3f}, "
          f"p90 {prior['p90']:.3f}, worst {prior['worst']:.3f}")
    if args.fit:
        kk = fit(timed, k)
        print("\nfitted on every row: " + ", ".join(f"{n}={getattr(kk, n):.4g}" for n in FREE))
        s = summary([r.error(kk) for r in timed])
        print(f"in-sample (not a measure of prediction): median |ln| {s['median']:.3f}, worst {s['worst']:.3f}")
        if args.write:
            record = calibration.record(timed, k, held, kk)
            path = step_model_fit.write(record)
            changed = {n: (getattr(k, n), v) for n, v in record["fitted"].items() if getattr(k, n) != v}
            print(f"\nwrote {path} (fingerprint {record['fingerprint']['sha256'][:12]}); defaults "
                  f"changed (was, now): {changed or 'none'}")
            return
    stale = step_model_fit.stale()
    print(f"\n{stale}" if stale else f"\n{step_model_fit.FILE} matches the code and data it was fitted from")


if __name__ == "__main__":
    main()
