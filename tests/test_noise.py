"""Measured run-to-run noise: the random-effects estimate and its interval, ``python -m moe_hydra.noise``
(noise.json), and compare judging one-run arms with it (``--noise``, compare.noise_file, the site file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_hydra.analysis import compare, figures
from moe_hydra.analysis.runs import load as load_runs
from moe_hydra.analysis import noise as noises
from moe_hydra.commands import run_command
from moe_hydra.core import stats
from moe_hydra.core.errors import EXIT_FAILED, EXIT_REFUSED
from tests.test_compare import BASE_CONTRACT, fake_run, rewrite

RNG_RUNS = 8


def synthetic_runs(rng, k: int, sigma_b: float, sigma_w: float, n: int, mean: float = 100.0) -> list[list[float]]:
    return (mean * (1 + rng.normal(0, sigma_b, k)[:, None] + rng.normal(0, sigma_w, (k, n)))).tolist()


# --------------------------------------------------------------------------- the estimate


def test_the_anova_estimate_matches_its_formulas_on_unbalanced_runs():
    runs = [[10.0, 12.0, 11.0], [14.0, 15.0], [9.0, 10.0, 11.0, 10.0], [13.0, 12.0, 14.0]]
    nz = stats.run_noise([runs])
    n = np.array([len(r) for r in runs], float)
    means = np.array([np.mean(r) for r in runs])
    grand = np.concatenate(runs).mean()
    msb = (n * (means - grand) ** 2).sum() / 3
    msw = sum(((np.array(r) - np.mean(r)) ** 2).sum() for r in runs) / (n.sum() - 4)
    n0 = (n.sum() - (n**2).sum() / n.sum()) / 3
    assert (nz.msb, nz.msw, nz.n0) == pytest.approx((msb, msw, n0))
    assert nz.var_between == pytest.approx((msb - msw) / n0) and nz.var_within == pytest.approx(msw)
    assert nz.relative == pytest.approx(np.sqrt((msb - msw) / n0) / grand)
    assert nz.var_low <= nz.var_between <= nz.var_high and nz.df > 0


def test_the_estimate_recovers_known_variances_and_truncates_at_zero():
    rng = np.random.default_rng(1)
    nz = stats.run_noise([synthetic_runs(rng, 60, 0.02, 0.05, 40)])
    assert nz.relative == pytest.approx(0.02, abs=0.005) and nz.step_noise == pytest.approx(0.05, abs=0.002)
    assert nz.interval[0] < 0.02 < nz.interval[1]
    flat = stats.run_noise([synthetic_runs(rng, 6, 0.0, 0.05, 10)])  # no run effect: often MSB < MSW
    assert flat.var_between >= 0 and flat.var_low >= 0
    with pytest.raises(ValueError, match="two runs of one config"):
        stats.run_noise([[[1.0, 2.0]]])


def test_the_mls_interval_covers_sigma_between_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    cover = sum(nz.var_low <= (0.02 * 100) ** 2 <= nz.var_high
                for nz in (stats.run_noise([synthetic_runs(rng, RNG_RUNS, 0.02, 0.05, 20)]) for _ in range(400)))
    assert 0.90 <= cover / 400 <= 0.99, cover


def test_one_run_arms_with_a_measured_noise_keep_false_verdicts_near_5_percent():
    """2,000 A/A pairs of one run each, each judged with a noise measured from 8 other runs (t on its
    Satterthwaite df): faster/slower about 5 % of the time (the nominal level, within simulation error); a
    step-level Welch with no floor would call about half of them different."""
    rng = np.random.default_rng(3)
    false = bare = 0
    for _ in range(2000):
        nz = stats.run_noise([synthetic_runs(rng, RNG_RUNS, 0.02, 0.05, 20)])
        a, b = synthetic_runs(rng, 2, 0.02, 0.05, 20)
        e = stats.measured([stats.RunStat.of(a)], [stats.RunStat.of(b)], nz.relative, max(nz.df, 1.0),
                           step_noise=nz.step_noise, step_df=nz.df_within)
        false += e.verdict in (stats.FASTER, stats.SLOWER)
        bare += stats.welch(a, b, "steps").verdict in (stats.FASTER, stats.SLOWER)
    assert false / 2000 <= 0.06 and bare / 2000 > 0.3, (false, bare)


def test_repeats_measured_into_a_noise_never_call_each_other_different():
    """compare DIR --variable repeat --noise DIR/noise.json on the same runs: the noise says how far runs differ,
    so none of them is faster or slower than another (whatever their steps' spread)."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        runs = [(100 * (1 + rng.normal(0, rng.uniform(0, 0.1)) + rng.normal(0, rng.uniform(0.01, 0.3), 7))).tolist()
                for _ in range(4)]
        nz = stats.run_noise([runs])
        for other in runs[1:]:
            e = stats.measured([stats.RunStat.of(runs[0])], [stats.RunStat.of(other)], nz.relative, max(nz.df, 1.0),
                               step_noise=nz.step_noise, step_df=nz.df_within)
            assert e.verdict == stats.UNDECIDED, e


# --------------------------------------------------------------------------- python -m moe_hydra.noise


def a_a(root: Path, k: int = 4, seed: int = 5, sigma_b: float = 0.02) -> Path:
    """A sweep directory of k repeats of one config (swept: repeat), on the declared local_cpu noise (20 %)."""
    rng = np.random.default_rng(seed)
    for i, times in enumerate(synthetic_runs(rng, k, sigma_b, 0.05, 23)):
        d = fake_run(root, str(i), times, swept=("repeat",), tracking={"job_type": f"repeat={i}"})
        rewrite(d, contract={**BASE_CONTRACT, "hardware": {"name": "local_cpu", "run_to_run_noise": 0.2}})
    return root


def test_noise_command_writes_noise_json_into_the_first_directory(tmp_path, capsys):
    d = a_a(tmp_path / "aa", k=6)
    assert run_command("noise", [str(d)]) == 0
    rec = json.loads((d / "noise.json").read_text())
    assert rec["source"] == "measured" and 0 <= rec["run_to_run_noise"] < 0.1 and rec["runs"] == 6
    assert rec["steps"] == 6 * 20 and rec["steps_per_run"] == 20 and rec["window"] == [4, 23]
    lo, hi = rec["interval"]
    assert lo <= rec["run_to_run_noise"] <= hi and rec["df"] >= 0 and rec["step_noise"] == pytest.approx(0.05, abs=0.01)
    assert rec["hardware"] == {"name": "local_cpu", "run_to_run_noise": 0.2} and rec["declared"] == 0.2
    assert rec["contract"]["digest"] and len(rec["run_means_ms"]) == 6
    assert "run-to-run noise" in capsys.readouterr().out
    assert noises.load(d / "noise.json")["runs"] == 6
    # noise.png draws the runs' means and the between/within split, the same figures as noise.json
    drawn = figures.drawn(d / "noise.png")["noise"]
    assert drawn["run_means_ms"] == rec["run_means_ms"] and drawn["interval"] == rec["interval"]
    c = rec["components"]
    assert drawn["sigma_between_ms"] == pytest.approx(c["var_between_ms2"] ** 0.5)
    assert drawn["sigma_within_of_a_mean_ms"] == pytest.approx((c["var_within_ms2"] / c["n0"]) ** 0.5)
    out = tmp_path / "elsewhere"
    assert run_command("noise", [str(d), "--out", str(out)]) == 0 and (out / "noise.json").is_file()


def test_noise_command_refuses_what_is_not_repeats_of_one_config(tmp_path, capsys):
    one = a_a(tmp_path / "one", k=1)
    assert run_command("noise", [str(one)]) == EXIT_REFUSED
    assert "two runs of one config" in capsys.readouterr().err
    two = a_a(tmp_path / "two", k=3)
    rng = np.random.default_rng(6)
    for i in range(3):
        fake_run(two, f"b{i}", synthetic_runs(rng, 1, 0.02, 0.05, 23)[0], seq=256, swept=("repeat",))
    assert run_command("noise", [str(two)]) == EXIT_REFUSED
    assert "train.seq_length: 128 vs 256" in capsys.readouterr().err
    assert run_command("noise", [str(two), "--pool"]) == 0
    assert json.loads((two / "noise.json").read_text())["configs"] == 2
    (tmp_path / "file").write_text("")
    assert run_command("noise", [str(two), "--pool", "--out", str(tmp_path / "file" / "sub")]) == EXIT_FAILED


@pytest.mark.parametrize("content, said", [
    ("{", "not JSON"), ("[]", "not a JSON object"), ('{"source": "declared", "run_to_run_noise": 0.02}', "source"),
    ('{"source": "measured", "run_to_run_noise": 1.5}', "run_to_run_noise is 1.5"),
    ('{"source": "measured", "run_to_run_noise": 0.02, "df": -1}', "df is -1"),
])
def test_a_bad_noise_file_is_refused_naming_the_field(tmp_path, capsys, content, said):
    d = a_a(tmp_path / "aa")
    (tmp_path / "noise.json").write_text(content)
    code = run_command("compare", [str(d), "--variable", "repeat", "--noise", str(tmp_path / "noise.json"), "--out",
                         str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == EXIT_REFUSED and said in err, err


def test_noise_and_noise_floor_are_one_or_the_other(tmp_path):
    with pytest.raises(SystemExit) as e:
        run_command("compare", [str(tmp_path), "--noise", "x.json", "--noise-floor", "0.1"])
    assert e.value.code == EXIT_REFUSED


# --------------------------------------------------------------------------- compare with the measured noise


def test_compare_with_the_measured_noise_of_an_a_a_sweep(tmp_path, capsys):
    """The acceptance check's path: an A/A sweep, its noise, compare --noise: no faster/slower, source measured,
    in the table, compare.md and compare.json."""
    d = a_a(tmp_path / "aa", k=4, sigma_b=0.05)
    assert run_command("noise", [str(d)]) == 0
    assert run_command("compare", [str(d), "--variable", "repeat", "--noise", str(d / "noise.json"), "--out",
                         str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    rec = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert len(rec["pairs"]) == 3
    for p in rec["pairs"]:
        assert p["verdict"] == stats.UNDECIDED and p["noise_floor"]["source"] == "measured", p
        assert p["noise_floor"]["value"] == json.loads((d / "noise.json").read_text())["run_to_run_noise"]
        assert p["unit"] == "runs" and p["arms"][0] == "repeat=0" and len(p["ci"]) == 2 and p["mde"] > 0
    assert "measured" in out and "measured" in (tmp_path / "cmp" / "compare.md").read_text()
    # the table and compare.md still say what "undecided" was called before equivalence existed
    assert "no significant difference" in out and "no significant" in (tmp_path / "cmp" / "compare.md").read_text()


def test_the_measured_noise_is_a_variance_not_a_floor(tmp_path):
    """10 % apart, steps tight: a step-level Welch is sure; a run-to-run noise of 8 % says one run each cannot
    tell; 40 % apart it can. The declared 20 % floor would call 40 % undecided too (CI starting below 20 %)."""
    def arms(delta, root):
        rng = np.random.default_rng(7)
        fake_run(root, "0", (100 * (1 + rng.normal(0, 0.01, 23))).tolist(), dispatcher="alltoall")
        fake_run(root, "1", ((100 + delta) * (1 + rng.normal(0, 0.01, 23))).tolist(), dispatcher="allgather")
        return load_runs([root], print).runs

    floor = noises.Floor(0.08, noises.MEASURED, file="n.json", df=7.0, step_noise=0.01)
    (small,) = compare.compare(arms(10, tmp_path / "a"), noise=floor)
    e = small.effects["dispatcher=allgather"]
    assert e.verdict == stats.UNDECIDED and e.unit == "runs" and e.ci_low < 0 < e.ci_high
    assert small.noise["dispatcher=allgather"].source == "measured" and "measured" in small.notes[0]
    (large,) = compare.compare(arms(40, tmp_path / "b"), noise=floor)
    assert large.effects["dispatcher=allgather"].verdict == stats.SLOWER


def test_compare_noise_file_from_the_runs_config_and_from_the_site(tmp_path, monkeypatch):
    d = a_a(tmp_path / "aa", k=4)
    assert run_command("noise", [str(d), "--out", str(tmp_path / "site")]) == 0
    for i in range(4):  # as a run records its config: compare.noise_file from the command line or the site file
        (d / str(i) / ".hydra").mkdir()
        (d / str(i) / ".hydra" / "config.yaml").write_text(
            f"compare:\n  noise_file: {tmp_path / 'site' / 'noise.json'}\n")
    assert run_command("compare", [str(d), "--variable", "repeat", "--out", str(tmp_path / "c1")]) == 0
    assert {p["noise_floor"]["source"] for p in json.loads((tmp_path / "c1" / "compare.json").read_text())["pairs"]} \
        == {"measured"}
    for i in range(4):
        (d / str(i) / ".hydra" / "config.yaml").write_text("compare:\n  noise_file: null\n")
    assert run_command("compare", [str(d), "--variable", "repeat", "--out", str(tmp_path / "c2")]) == 0
    assert {p["noise_floor"]["source"] for p in json.loads((tmp_path / "c2" / "compare.json").read_text())["pairs"]} \
        == {"declared"}
    # a site file names it, relative to $MOE_HYDRA_SITE
    (tmp_path / "site" / "site").mkdir()
    (tmp_path / "site" / "site" / "default.yaml").write_text(
        "# @package _global_\ncompare:\n  noise_file: noise.json\n")
    monkeypatch.setenv("MOE_HYDRA_SITE", str(tmp_path / "site"))
    for i in range(4):
        (d / str(i) / ".hydra" / "config.yaml").unlink()
    assert run_command("compare", [str(d), "--variable", "repeat", "--out", str(tmp_path / "c3")]) == 0
    pairs = json.loads((tmp_path / "c3" / "compare.json").read_text())["pairs"]
    assert {p["noise_floor"]["source"] for p in pairs} == {"measured"}
    assert pairs[0]["noise_floor"]["file"] == str(tmp_path / "site" / "noise.json")
    # --noise-floor still names a floor of its own
    assert run_command("compare", [str(d), "--variable", "repeat", "--noise-floor", "0.05", "--out", str(tmp_path / "c4")]) == 0
    assert {p["noise_floor"]["source"] for p in json.loads((tmp_path / "c4" / "compare.json").read_text())["pairs"]} \
        == {"--noise-floor"}


def test_a_missing_configured_noise_file_falls_back_to_the_declared_one_with_a_warning(tmp_path, capsys, monkeypatch):
    d = a_a(tmp_path / "aa", k=2)
    monkeypatch.delenv("MOE_HYDRA_SITE", raising=False)
    for i in range(2):
        (d / str(i) / ".hydra").mkdir()
        (d / str(i) / ".hydra" / "config.yaml").write_text(f"compare:\n  noise_file: {tmp_path / 'gone.json'}\n")
    assert run_command("compare", [str(d), "--variable", "repeat", "--out", str(tmp_path / "c")]) == 0
    assert "the declared hardware.run_to_run_noise is used instead" in capsys.readouterr().err
    rec = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert rec["pairs"][0]["noise_floor"] == {"value": 0.2, "source": "declared"}


def test_relative_margins_read_percent_or_fraction():
    assert noises.relative_margin("2%") == pytest.approx(0.02) and noises.relative_margin("0.03") == 0.03
    for bad in ("0", "1", "150%", "nan", "x"):
        with pytest.raises(ValueError):
            noises.relative_margin(bad)


def test_noise_and_compare_log_their_pictures_to_the_runs_w_and_b_group(tmp_path, monkeypatch):
    """Runs logged with logger=wandb get their reports' pictures beside them in W&B: a run of job_type noise (or
    compare) in the runs' project and group, the picture as an image, the figures drawn in its summary; runs logged
    with logger=none get none."""
    from tests.test_tracking import _inspect

    monkeypatch.setenv("WANDB_MODE", "offline")
    d = a_a(tmp_path / "aa", k=4)
    for i in range(4):
        (d / str(i) / ".hydra").mkdir()
        (d / str(i) / ".hydra" / "config.yaml").write_text("logger:\n  name: none\n")
    assert run_command("noise", [str(d)]) == 0 and not (d / "wandb").exists()
    for i in range(4):
        (d / str(i) / ".hydra" / "config.yaml").write_text("logger:\n  name: wandb\n  project: noisy\n")
        rewrite(d / str(i), tracking={"job_type": f"repeat={i}", "group": "aa-0123abcd"})
    assert run_command("noise", [str(d)]) == 0
    assert run_command("compare", [str(d), "--variable", "repeat", "--out", str(d)]) == 0
    runs = list((d / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    kinds = set()
    for run_dir in runs:  # the two runs in either order (both may start within one second: one name prefix)
        records = _inspect(run_dir)
        (history,) = [r["history"]["item"] for r in records if r.get("type") == "history"]
        (kind,) = {k.split(".")[0] for k in history if k.endswith("._type")}
        kinds.add(kind)
        assert history[f"{kind}._type"] == "image-file"
        drawn = figures.drawn(d / f"{kind}.png")
        assert figures.drawn(run_dir / "files" / history[f"{kind}.path"]) == drawn  # the picture itself
        summary = _inspect(run_dir, "--summary")
        assert summary["summary"][f"{kind}/figures"] == drawn[kind]
        assert summary["project"] == "noisy" and summary["name"] == f"{kind}-aa-0123abcd"
        text = json.dumps(records)
        assert '"aa-0123abcd"' in text and f'"{kind}"' in text  # group, job_type
    assert kinds == {"noise", "compare"}
