"""``repeat=auto``: a sequential A/B that launches rounds of runs until the comparison is decided.

    python -m moe_hydra train.global_batch_size=8 train.micro_batch_size=4,8 repeat=auto [compare.max_repeats=8] \
        [compare.noise_file=F]

The arms are the sweep's points (here ``train.micro_batch_size=4`` and ``=8`` at one global batch; the first is the
baseline). Each
round launches one run of every undecided arm (``repeat=<round>``, job numbers continuing the sweep's, the arms'
order alternating between rounds so that neither always runs first) through the configured launcher, as the
sweep's own points (the local launcher, or Slurm), then looks: every candidate against the baseline with the
group-sequential test of :func:`moe_hydra.core.stats.sequential_looks` — the difference of run means two-sided, and
equivalence within a margin by two one-sided tests, each against Lan-DeMets O'Brien-Fleming-type alpha spending, so
that looking after every round keeps the false-verdict rate at ``compare.alpha`` (5 %). It stops when every
candidate is decided (faster, slower, equivalent) or at ``compare.max_repeats`` runs per arm (undecided).

The variance of a run's mean comes from the arms' own runs, pooled with the measured run-to-run noise when there is
one (``compare.noise_file``, e.g. from a site file; ``python -m moe_hydra.noise`` writes it; one named that cannot be
read refuses the sweep before anything launches): with it the first look is after round 1, without it after round
2. The equivalence margin is ``compare.equivalence`` (default 5 %), declared and fixed before the first run, as the
test requires; never derived from the noise. A pair still undecided at the cap says about how many runs per arm
would show equivalence (``pairs[].runs_needed``).

``sequential.json`` in the sweep directory, rewritten after every round (``sequential_version`` 1): ``status``
(running, decided, undecided at the cap, queued, refused, failed), ``design``, ``arms``, ``baseline``, ``rounds``
(per round the points launched — number, arm, directory, state, mean step ms — and each candidate's look), ``pairs``
(per candidate: the final verdict, relative step time with its repeated 95 % confidence interval, the looks taken,
the runs used) and ``runs_used`` per arm.

Detached (``launcher=slurm launcher.detach=true``): each invocation queues at most one round and returns; the same
command again, once it has run (``python -m moe_hydra.sweep wait DIR``), keeps the rounds that completed (the Slurm
launcher keeps complete points), looks, and queues the next round or stops. Locally (and attached on Slurm) one
command runs the rounds to the end.

Steady windows only: a run whose window is not steady (:mod:`moe_hydra.core.steady`) is not evidence. A
``contract.window=auto`` run (the default) that found no steady segment is run again with twice the steps
(:data:`LONGER_RERUNS` times), and a declared window that is not steady stops the A/B (``refused: a window is not
steady``, the fix in the log and in the round's ``points[].steady``).

Like with like: before the first round, the arms' resolved plans say what a step of each trains
(``sweeper.work``), and :func:`moe_hydra.core.contract.measure` decides the figure: step time when the work is the
same; tokens/s/GPU (tested as time per token) when the design varies it on purpose (``train.global_batch_size``
swept, ...); otherwise the sweep is refused with the fix (a micro batch swept while the global batch follows it).

The sweeper calls :func:`drive` (``hydra/sweeper=points``); ``repeat`` is an integer in the schema, so the command
line's ``repeat=auto`` becomes ``compare.sequential=true`` before Hydra composes anything (:func:`normalize`).
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from moe_hydra.analysis import noise as noises
from moe_hydra.analysis.compare import SEQUENTIAL_FILE
from moe_hydra.core import bounds, io, results, stats, steady
from moe_hydra.core import contract as contracts
from moe_hydra.core.errors import Refused
from moe_hydra.launch import outcome

log = logging.getLogger("moe_hydra")

AUTO = "repeat=auto"
FLAG = "compare.sequential"
SEQUENTIAL_VERSION = 1
SPENDING = ("Lan-DeMets O'Brien-Fleming-type alpha spending, alpha(t) = 2 - 2 Phi(z_{1-a/2} / sqrt(t)): two-sided "
            "for the difference (alpha / 2 a side), one-sided at alpha for each of the two equivalence tests (TOST); "
            "t = information fraction (runs per arm / max_repeats); z bounds turned into t at the same level")


def normalize(args: list[str]) -> list[str]:
    """The command line with ``repeat=auto`` as ``compare.sequential=true`` (and ``-m``: it is a sweep)."""
    if not any(a.lstrip("+") == AUTO for a in args):
        return list(args)
    out = [f"{FLAG}=true" if a.lstrip("+") == AUTO else a for a in args]
    return out if any(a in ("-m", "--multirun") for a in out) else ["-m", *out]


def requested(config: DictConfig) -> bool:
    """Whether the sweep is repeat=auto's."""
    return bool(OmegaConf.select(config, FLAG, default=False))


def _arm_label(arm: list[str], common: set[str]) -> str:
    return " ".join(o for o in arm if o not in common) or "(defaults)"


def design_of(config: DictConfig) -> tuple[stats.Design, dict[str, Any]]:
    """The design from the sweep's config (compare.*), and how its noise was chosen.

    Raises:
        Refused: compare.noise_file names a file that is missing or not a noise file (an input named explicitly
            is never skipped: the test would run without what it was told to pool).
    """
    def sel(key: str, default: Any = None) -> Any:
        return OmegaConf.select(config, key, default=default)

    floor = None
    path = sel("compare.noise_file")
    if path:
        p = noises.resolve_path(str(path))
        try:
            floor = noises.floor_of(noises.load(p), p)
        except Refused as e:
            raise Refused(f"compare.noise_file: {e}; fix: compare.noise_file=<a noise.json from moe-hydra noise> "
                          "or compare.noise_file=null") from None
    window = sel("contract.window") or [1, 1]
    steps = (int(sel("contract.steady_steps", steady.STEADY_STEPS)) if window == steady.AUTO
             else max(int(window[-1]) - int(window[0]) + 1, 1))
    # one run's mean, relative: the measured run-to-run noise and its steps' over the window's n
    run_sd = math.sqrt(floor.value**2 + (floor.step_noise or 0.0) ** 2 / steps) if floor is not None else None
    margin = sel("compare.equivalence", stats.EQUIVALENCE)
    futility = sel("compare.futility")
    design = stats.Design(max_repeats=int(sel("compare.max_repeats", 8)), alpha=float(sel("compare.alpha", 0.05)),
                          margin=float(margin) if margin is not None and 0 < float(margin) < 1 else None,
                          futility=float(futility) if futility is not None else None,
                          noise=floor.value if floor else None, noise_df=floor.df if floor else None,
                          step_noise=floor.step_noise if floor else None)
    info = {"margin_source": "compare.equivalence (declared)", "noise_floor": floor.as_dict() if floor else None,
            "window_steps": steps, "spending": SPENDING}
    if floor is not None and design.margin:  # the power to find an effect as large as the margin, z-approximation
        from scipy import stats as st

        bound = stats.spending_bounds([k / design.max_repeats for k in range(1, design.max_repeats + 1)],
                                      design.alpha, 2)[-1]
        shift = design.margin / run_sd * math.sqrt(design.max_repeats / 2)
        info["power_at_margin"] = float(st.norm.sf(bound - shift))
    return design, info


def _run_stat(ret: Any, tokens_per_gpu: float | None = None
              ) -> tuple[stats.RunStat | None, str | None, float | None]:
    """(the run as the test reads it, its directory, its window's mean step time) of a settled point; None when
    incomplete or its window is not steady (not evidence). ``tokens_per_gpu``: the test reads time per token (each
    step's time over its tokens per GPU)."""
    point_dir = outcome.output_dir(ret)
    res = outcome.complete_results(point_dir) if point_dir else None
    if not res or not steady.of_results(res).window_steady:
        return None, str(point_dir) if point_dir else None, None
    measured = results.measured_window(res)
    if measured is None:
        return None, str(point_dir), None
    steps = res["step_times_ms"][measured[0] - 1:measured[1]]
    run = stats.RunStat.of([t / tokens_per_gpu for t in steps] if tokens_per_gpu else steps)
    return run, str(point_dir), statistics.fmean(steps)


def drive(sweeper: Any, overrides: list) -> list[list[Any]]:
    """Run repeat=auto's rounds through ``sweeper`` (the points sweeper: its ``config``, ``hydra_context`` and
    ``_launch(batch, first_job_number)``) over the sweep ``overrides`` (Hydra's parsed ones); every round's
    JobReturns, one batch per round. Writes ``sequential.json`` into the sweep directory after every round."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    config = sweeper.config
    sweep_dir = Path(str(config.hydra.sweep.dir))
    arms = [list(p) for batch in BasicSweeper.split_arguments(overrides, None) for p in batch]

    def refused(message: str) -> list[list[Any]]:
        return [[outcome.refuse(sweeper.hydra_context, config, ["repeat=auto"], message)]]

    if any(o.split("=", 1)[0].lstrip("+~") == "repeat" for arm in arms for o in arm):
        return refused("repeat=auto sets the repeat index itself; drop the other repeat=... override. "
                       "Nothing was launched.")
    if len(arms) < 2:
        return refused("repeat=auto compares arms: sweep the variable under test (e.g. "
                       "dispatcher=alltoall,allgather repeat=auto -m). Nothing was launched.")
    stage = OmegaConf.select(config, "stage", default="run")
    if getattr(stage, "value", stage) != "run":
        return refused("repeat=auto measures: it needs stage=run. Nothing was launched.")
    # S02 for the keys the rounds are planned from, before any point (each point would refuse them too)
    wrong = [f"[S02] {key} must be within [{lo:g}, {hi:g}] (is {v}); fix: {key}={hi if v > hi else lo:g}"
             for key, (lo, hi) in bounds.DOMAINS.items() if key.startswith("compare.")
             and (v := OmegaConf.select(config, key, default=None)) is not None and not lo <= v <= hi]
    if wrong:
        return refused("\n  ".join(wrong) + "\nNothing was launched.")
    try:
        design, info = design_of(config)
    except Refused as e:
        return refused(f"{e}. Nothing was launched.")
    common = set.intersection(*(set(a) for a in arms))
    labels = [_arm_label(a, common) for a in arms]
    try:  # like with like, before anything is launched
        metric, per_gpu = _measure(sweeper, arms, labels, common)
    except Refused as e:
        return refused(f"{e}. Nothing was launched.")
    runs: list[list[stats.RunStat | None]] = [[] for _ in arms]
    decided: dict[int, list[stats.Look]] = {}
    looks_of: dict[int, list[stats.Look]] = {}
    record: dict[str, Any] = {"sequential_version": SEQUENTIAL_VERSION, "status": "running",
                              "design": {**design.as_dict(), **info}, "arms": labels, "baseline": labels[0],
                              "metric": metric, "tokens_per_step_per_gpu": per_gpu,
                              "rounds": [], "pairs": [], "runs_used": {}}
    returns: list[list[Any]] = []
    num = 0
    log.info("repeat=auto: %d arms (baseline %s), at most %d runs each; %s; run-to-run noise %s", len(arms),
             labels[0], design.max_repeats, f"equivalence within ±{design.margin:.2%} ({info['margin_source']})"
             if design.margin else info["margin_source"].replace("none: ", ""),
             f"{design.noise:.2%} measured, pooled with the arms' runs" if design.noise is not None
             else "from the arms' runs")
    for r in range(design.max_repeats):
        active = [0] + [i for i in range(1, len(arms)) if i not in decided]
        order = active if r % 2 == 0 else active[::-1]
        batch = [[*arms[i], f"repeat={r}"] for i in order]
        rets = list(sweeper._launch(batch, num))
        num += len(batch)
        returns.append(rets)
        states = [outcome.state_of(ret) for ret in rets]
        points = []
        for i in range(len(arms)):
            runs[i].append(None)
        unsteady = []
        for i, ret, st_ in zip(order, rets, states):
            run, point_dir, mean = _run_stat(ret, per_gpu[i] if metric == contracts.THROUGHPUT else None)
            runs[i][r] = run
            points.append({"num": num - len(batch) + order.index(i), "arm": labels[i], "dir": point_dir,
                           "state": st_, "mean_ms": mean})
            judged = _unsteady(ret)
            if judged is not None:
                points[-1]["steady"] = judged.as_dict()
                unsteady.append((i, judged))
        num, unsteady = _rerun_longer(sweeper, arms, labels, r, unsteady, runs, points, num, per_gpu, metric,
                                      returns)
        entry: dict[str, Any] = {"round": r + 1, "points": points, "looks": {}}
        record["rounds"].append(entry)
        if any(s == outcome.SUBMITTED for s in states):
            record["status"] = "queued"
            log.info("repeat=auto: round %d queued; once it has run (python -m moe_hydra.sweep wait %s), the same "
                     "command looks and queues the next round", r + 1, sweep_dir)
            break
        if "INVALID" in states:
            record["status"] = "refused"
            log.error("repeat=auto: a point of round %d was refused; stopped", r + 1)
            break
        if unsteady:
            i, judged = unsteady[0]
            record["status"] = "refused: a window is not steady"
            log.error("repeat=auto: round %d: %s's run is not evidence: %s; stopped", r + 1, labels[i],
                      judged.describe())
            break
        if all(runs[i][r] is None for i in order):
            record["status"] = "failed"
            log.error("repeat=auto: no run of round %d completed; stopped", r + 1)
            break
        for j in range(1, len(arms)):
            if j in decided:
                continue
            looks = stats.sequential_looks(runs[0], runs[j], design)
            looks_of[j] = looks
            if looks and looks[-1].look == r + 1:
                entry["looks"][labels[j]] = looks[-1].as_dict()
                lk = looks[-1]
                log.info("repeat=auto round %d: %s vs %s: %s %+.2f%% [%+.2f%%, %+.2f%%] (t %.2f, bound %.2f%s) -> %s",
                         r + 1, labels[j], labels[0], _TESTED[metric], 100 * lk.rel_step_time, 100 * lk.ci_low,
                         100 * lk.ci_high, lk.t, lk.bound,
                         f", equivalence bound {lk.eq_bound:.2f}" if lk.eq_bound else "",
                         f"stopped: a gain of {design.futility:.1%} ruled out (at most {lk.gain_bound:.1%})"
                         if lk.futile else lk.verdict)
            if stats.decided(looks, design) and (looks[-1].verdict != stats.UNDECIDED or looks[-1].futile):
                decided[j] = looks
        if len(decided) == len(arms) - 1:
            record["status"] = ("decided" if any(ls[-1].verdict != stats.UNDECIDED for ls in decided.values())
                                else "stopped for futility (compare.futility)")
            break
        record["pairs"] = _pairs(labels, looks_of, runs, metric)
        _write(sweep_dir, record, runs, labels)
    else:
        record["status"] = "undecided at the cap (compare.max_repeats)"
    record["pairs"] = _pairs(labels, looks_of, runs, metric)
    _write(sweep_dir, record, runs, labels)
    _report(record, sweep_dir)
    return returns


def overrides_key(o: str) -> str:
    return o.split("=", 1)[0].lstrip("+~")


# contract.window=auto runs that end without a steady segment are run again this many times, each with twice the
# steps (train.train_iters), before the A/B stops for want of one
LONGER_RERUNS = 2


def _unsteady(ret: Any) -> steady.Judgment | None:
    """The judgment of a completed point whose window is not steady; None otherwise (steady, or not complete)."""
    point_dir = outcome.output_dir(ret)
    res = outcome.complete_results(point_dir) if point_dir else None
    if not res:
        return None
    judged = steady.of_results(res)
    return None if judged.window_steady else judged


def _rerun_longer(sweeper: Any, arms: list[list[str]], labels: list[str], r: int, unsteady: list, runs: list,
                  points: list, num: int, per_gpu: list, metric: str, returns: list) -> tuple[int, list]:
    """The round's points whose window is not steady, run again longer rather than judged: a contract.window=auto
    run that found no steady segment, with twice its steps (train.train_iters; auto's cap is not part of the
    contract), up to :data:`LONGER_RERUNS` times. (next job number, the points still not steady: those with a
    declared window, or no steady segment in the longest run)."""
    for attempt in range(LONGER_RERUNS):
        again = [i for i, j in unsteady if j.segment is None and j.auto]
        if not again:
            break
        longer = f"train.train_iters={2 ** (attempt + 1) * _cap(arms[again[0]])}"
        batch = [[*(o for o in arms[i] if overrides_key(o) != "train.train_iters"), f"repeat={r}", longer]
                 for i in again]
        log.info("repeat=auto round %d: %s found no steady segment; run again with %s", r + 1,
                 ", ".join(labels[i] for i in again), longer)
        rets = list(sweeper._launch(batch, num))
        returns.append(rets)
        still = [(i, j) for i, j in unsteady if i not in again]
        for k, (i, ret) in enumerate(zip(again, rets)):
            run, point_dir, mean = _run_stat(ret, per_gpu[i] if metric == contracts.THROUGHPUT else None)
            runs[i][r] = run
            judged = _unsteady(ret)
            points.append({"num": num + k, "arm": labels[i], "dir": point_dir, "state": outcome.state_of(ret),
                           "mean_ms": mean, "longer": longer, **({"steady": judged.as_dict()} if judged else {})})
            if judged is not None:
                still.append((i, judged))
        num += len(batch)
        unsteady = still
    return num, unsteady


def _cap(arm: list[str]) -> int:
    """The steps an arm's auto runs may take (its train.train_iters, else auto's own cap)."""
    from moe_hydra.core.schema import AUTO_MAX_STEPS

    given = [o.split("=", 1)[1] for o in arm if overrides_key(o) == "train.train_iters"]
    try:
        return int(given[-1]) if given else AUTO_MAX_STEPS
    except ValueError:
        return AUTO_MAX_STEPS


def _measure(sweeper: Any, arms: list[list[str]], labels: list[str], common: set[str]
             ) -> tuple[str, list[float | None]]:
    """(the figure the arms are judged on, each arm's tokens a step per GPU): :func:`moe_hydra.core.contract.measure`
    over the work of the arms' resolved plans (``sweeper.work``; an arm that does not plan is left out: its point is
    refused when launched).

    Raises:
        Refused: the arms do different work a step and the design does not vary it on purpose.
    """
    works = [sweeper.work(arm) for arm in arms]
    variables = sorted({o.split("=", 1)[0].lstrip("+~") for arm in arms for o in arm if o not in common})
    metric = contracts.measure(works, variables, labels)
    return metric, [w.tokens_per_gpu if w else None for w in works]


# what the sequential test runs on, per figure: the figure itself, or its reciprocal (lower stays better)
_TESTED = {contracts.STEP_TIME: "step time", contracts.THROUGHPUT: "time per token (1 / tokens/s/GPU)"}


def _pairs(labels: list[str], looks_of: dict[int, list[stats.Look]], runs: list[list],
           metric: str = contracts.STEP_TIME) -> list[dict[str, Any]]:
    """Each candidate against the baseline: the verdict and the change with its repeated 95 % interval, in the
    figure judged (``metric``): step time, or tokens/s/GPU (the test ran on time per token; the interval is turned
    into tokens/s/GPU, ``rel_tokens_per_s_per_gpu``)."""
    out = []
    for j in range(1, len(labels)):
        looks = looks_of.get(j) or []
        last = looks[-1] if looks else None
        change: dict[str, Any] = {"rel_step_time": None, "ci": None, "equivalence_ci": None}
        # the interval beside a verdict is the one its test read: the equivalence test's for equivalent
        lo, hi = ((last.eq_ci_low, last.eq_ci_high) if last and last.verdict == stats.EQUIVALENT
                  else (last.ci_low, last.ci_high) if last else (None, None))
        if last and metric == contracts.STEP_TIME:
            change = {"rel_step_time": last.rel_step_time, "ci": [last.ci_low, last.ci_high],
                      "equivalence_ci": [last.eq_ci_low, last.eq_ci_high] if last.eq_ci_low is not None else None,
                      "verdict_ci": [lo, hi]}
        elif last:
            def tps(rel: float) -> float:
                return 1 / (1 + rel) - 1 if rel > -1 else math.inf

            change = {"rel_step_time": None, "rel_time_per_token": last.rel_step_time,
                      "rel_tokens_per_s_per_gpu": tps(last.rel_step_time),
                      "ci": [tps(last.ci_high), tps(last.ci_low)],
                      "equivalence_ci": ([tps(last.eq_ci_high), tps(last.eq_ci_low)] if last.eq_ci_low is not None
                                         else None),
                      "verdict_ci": [tps(hi), tps(lo)]}
        out.append({"baseline": labels[0], "candidate": labels[j], "metric": metric,
                    "verdict": last.verdict if last else stats.UNDECIDED, **change,
                    "verdict_ci_is": (None if not last else "the equivalence test's (1 - 2 alpha, repeated)"
                                      if last.verdict == stats.EQUIVALENT else "repeated 95%"),
                    "runs_needed": last.runs_needed if last else None,
                    "futile": bool(last and last.futile), "gain_bound": last.gain_bound if last else None,
                    "looks": len(looks), "decided_at_round": last.look if last and last.verdict != stats.UNDECIDED
                    else None,
                    "runs": {labels[0]: sum(x is not None for x in runs[0]),
                             labels[j]: sum(x is not None for x in runs[j])}})
    return out


def _write(sweep_dir: Path, record: dict[str, Any], runs: list[list], labels: list[str]) -> None:
    record["runs_used"] = {labels[i]: sum(x is not None for x in runs[i]) for i in range(len(labels))}
    if len(record["pairs"]) == 1:
        record["verdict"] = record["pairs"][0]["verdict"]
    io.write_json(io.finite(record), sweep_dir / SEQUENTIAL_FILE)


def _report(record: dict[str, Any], sweep_dir: Path) -> None:
    lines = [f"repeat=auto: {record['status']}; runs used "
             + ", ".join(f"{k}: {v}" for k, v in record["runs_used"].items())]
    margin = record["design"].get("margin")
    for p in record["pairs"]:
        ci = p.get("verdict_ci")
        throughput = p.get("metric") == contracts.THROUGHPUT
        rel = p.get("rel_tokens_per_s_per_gpu") if throughput else p["rel_step_time"]
        within = f" within ±{margin:.2%}" if p["verdict"] == stats.EQUIVALENT and margin else ""
        lines.append(f"  {p['candidate']} vs {p['baseline']}: {p['verdict']}{within}"
                     + (f", {'tokens/s/GPU' if throughput else 'step time'} {rel:+.2%} [{ci[0]:+.2%}, {ci[1]:+.2%}] "
                        f"({p['verdict_ci_is']} interval)" if ci and all(x is not None and math.isfinite(x) for x in ci)
                        else "")
                     + (f"; about {p['runs_needed']} runs per arm would show equivalence within ±{margin:.2%} "
                        "(compare.max_repeats)" if p.get("runs_needed") and margin else "")
                     + (f"; stopped: a gain of {record['design']['futility']:.2%} ruled out (the gain is at most "
                        f"{p['gain_bound']:.2%}, one-sided {1 - stats.FUTILITY_BETA:.0%})" if p.get("futile") else ""))
    if record.get("metric") == contracts.THROUGHPUT:
        lines.append("  judged on tokens/s/GPU: the design varies the work a step ("
                     + ", ".join(f"{a}: {w:g} tokens/GPU" for a, w in zip(record["arms"],
                                                                         record["tokens_per_step_per_gpu"]) if w)
                     + "); the test ran on time per token")
    lines.append(f"  {sweep_dir / SEQUENTIAL_FILE}")
    io.console().print("\n".join(lines), markup=False, highlight=False)
