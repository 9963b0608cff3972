"""Real data (docs/data.md): a Megatron indexed dataset prepared from the repository's own text trains a
training-equivalent run that ``compare --accept`` accepts; bad data is refused before anything starts; the contract
names the data by content."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hydra.core import contract
from moe_hydra.core.resolved import resolve
from moe_hydra.planning import plan
from tests.conftest import ROOT, calm, compose_config, run_cli
from tests.data.fixtures import BYTES, text_docs, write_dataset

DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
WINDOW = "contract.window=[41,50]"  # 50 steps: what acceptance needs


def prepare(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moe_hydra.data", "prepare", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def compare(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moe_hydra.compare", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[str, subprocess.CompletedProcess]:
    """The repository's docs and README, one document per file, byte-level."""
    out = tmp_path_factory.mktemp("ds") / "docs"
    r = prepare("--out", str(out), *map(str, DOCS), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return str(out), r


def _train(tmp: Path, *overrides: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, Path]:
    r = run_cli(f"hydra.run.dir={tmp}/run", "logger=none", *overrides, cwd=tmp, timeout=timeout)
    return r, tmp / "run"


@pytest.fixture(scope="module")
def real_run(dataset, tmp_path_factory) -> Path:
    """A real run on the prepared dataset, its step times then made calm (each the window's median +-1 %): the tests
    are on its data and its acceptance, which refuses a window that is not steady, and the suite's load (CI: two
    workers on two cores) can leave a real run's declared window with a change of level (tests/test_steady.py
    judges real runs)."""
    r, run = _train(tmp_path_factory.mktemp("real"), "data.kind=megatron", f"data.path=[{dataset[0]}]", WINDOW)
    assert r.returncode == 0, r.stderr[-3000:]
    calm(run, json.loads((run / "results.json").read_text())["window"])
    return run


# ----------------------------------------------------------------------------- prepare

def test_prepare_writes_a_megatron_dataset_with_its_tokenizer(dataset):
    prefix, r = dataset
    texts = [p.read_bytes() for p in DOCS]
    tokens = sum(len(t) + 1 for t in texts)  # every byte, and the end of each document
    assert f"prefix {prefix}: {tokens} tokens in {len(DOCS)} documents (uint16" in r.stdout
    assert f'"data.path=[{prefix}]"' in r.stdout
    assert json.loads(Path(prefix + ".tokenizer.json").read_text())["vocab_size"] == 258
    facts = contract.read_index(prefix)
    assert (facts.dtype, facts.documents, facts.sequences, facts.tokens) == ("uint16", len(DOCS), len(DOCS), tokens)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    read = IndexedDataset(prefix)  # Megatron-Core's own reader (held while its arrays are read: they view its mmap)
    assert len(read) == len(DOCS)
    assert read[0].tolist() == [*texts[0], 256] and read[len(DOCS) - 1].tolist() == [*texts[-1], 256]


def test_prepare_refuses_a_missing_input_with_one_message(tmp_path):
    r = prepare("--out", str(tmp_path / "ds" / "x"), str(ROOT / "README.md"), str(tmp_path / "absent.md"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"moe_hydra.data: refused: input file not found: {tmp_path / 'absent.md'}; "
                                                 "nothing was written")
    assert not (tmp_path / "ds").exists()


# ----------------------------------------------------------------------------- a run on it, and acceptance

@pytest.mark.slow
def test_a_real_data_run_learns_is_training_equivalent_and_accepted(real_run, dataset):
    res = json.loads((real_run / "results.json").read_text())
    assert res["status"] == "ok" and res["steps"] == 50
    assert res["label"] == "training-equivalent" and res["label_reasons"] == []
    per_step = res["loss"]["per_step"]
    assert sum(per_step[40:50]) / 10 < sum(per_step[:3]) / 3 - 1.0, per_step  # it learns the text
    data = res["contract"]["data"]
    facts = contract.read_index(dataset[0])
    assert data["prefixes"] == [dataset[0]] and data["weights"] is None and data["split"] == "969,30,1"
    assert data["files"] == [{"prefix": dataset[0], "bin_bytes": facts.bin_bytes, "idx_bytes": facts.idx_bytes,
                              "idx_sha256": contract.fingerprint(dataset[0])["idx_sha256"]}]
    assert data["tokenizer"] == BYTES
    assert sorted(p.name.split("-", 1)[1] for p in (real_run / "data_cache").iterdir()) == [
        "GPTDataset-train-description.txt", "GPTDataset-train-document_index.npy",
        "GPTDataset-train-sample_index.npy", "GPTDataset-train-shuffle_index.npy"]  # Megatron's own index cache
    r = compare("--accept", str(real_run), cwd=real_run)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "accepted" in r.stdout and "label training-equivalent" in r.stdout
    assert "  loss falls: " in r.stdout


@pytest.mark.slow
def test_the_same_run_on_mock_data_is_refused_by_accept(tmp_path):
    r, run = _train(tmp_path, WINDOW)
    assert r.returncode == 0, r.stderr[-3000:]
    r = compare("--accept", str(run), cwd=tmp_path)
    assert r.returncode == 2
    assert "benchmark-only: mock data (data.kind=mock: synthetic tokens)" in r.stdout + r.stderr


def test_a_real_data_run_whose_loss_does_not_fall_is_refused(real_run, tmp_path):
    """The gate reads the run's losses: the same results with a flat loss curve are refused, naming why."""
    from moe_hydra.analysis import acceptance
    from moe_hydra.analysis.runs import Run

    if not (real_run / "results.json").exists():
        pytest.skip("the real-data run did not complete")
    res = json.loads((real_run / "results.json").read_text())
    res["loss"]["per_step"] = [5.0] * res["steps"]
    problems = acceptance.acceptance_problems(Run(path=tmp_path, results=res), [])
    assert problems == ["the loss does not fall on real data: 5.0000 -> 5.0000 (mean of steps 1..3 -> window mean)"]


# ----------------------------------------------------------------------------- refused before launch

def _corrupt_copy(prefix: str, tmp: Path) -> str:
    out = tmp / "corrupt" / "docs"
    out.parent.mkdir()
    for suffix in (".bin", ".idx", ".tokenizer.json"):
        shutil.copy(prefix + suffix, str(out) + suffix)
    with open(str(out) + ".idx", "r+b") as f:
        f.write(b"NOTANIDX\x00")  # Megatron's magic overwritten
    return str(out)


@pytest.mark.parametrize("case", ["corrupt idx", "missing prefix", "vocabulary larger than the model's"])
def test_bad_data_is_refused_before_anything_starts(case, dataset, tmp_path):
    prefix, extra, named = dataset[0], [], ["data.path"]
    if case == "corrupt idx":
        prefix, rule = _corrupt_copy(prefix, tmp_path), "D05"
    elif case == "missing prefix":
        prefix, rule = str(tmp_path / "nowhere" / "docs"), "D04"
    else:
        extra, rule, named = ["model.vocab_size=200"], "D06", ["data.path", "model.vocab_size=200"]
    r, run = _train(tmp_path, "data.kind=megatron", f"data.path=[{prefix}]", *extra, timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "nothing was launched" in r.stderr
    assert f"[{rule}]" in r.stderr and all(n in r.stderr for n in named), r.stderr
    assert not (run / "results.json").exists() and not (run / "plan.json").exists()
    (v,) = json.loads((run / "violations.json").read_text())["violations"]
    assert v["rule"] == rule and v["fields"]["data.path"] == [prefix]


def test_a_plan_is_made_where_the_data_is_not(tmp_path):
    """stage=plan leaves the files alone (plans are made anywhere); the contract records what it could not read."""
    prefix = str(tmp_path / "absent")
    p = plan.make_plan(resolve(compose_config("stage=plan", "data.kind=megatron", f"data.path=[{prefix}]")))
    assert p["label"] == "training-equivalent"
    assert p["contract"]["data"]["files"] == [{"prefix": prefix, "bin_bytes": None, "idx_bytes": None,
                                               "idx_sha256": None}]


# ----------------------------------------------------------------------------- the contract names the data

def _contract_hash(*overrides: str) -> str:
    return plan.make_plan(resolve(compose_config("stage=run", "data.kind=megatron", *overrides)))["contract_hash"]


def test_the_contract_changes_with_the_data(tmp_path):
    a = write_dataset(tmp_path / "a", text_docs(4), tokenizer=BYTES)
    b = write_dataset(tmp_path / "b", text_docs(3), tokenizer=BYTES)
    ha, hb = _contract_hash(f"data.path=[{a}]"), _contract_hash(f"data.path=[{b}]")
    assert ha != hb
    assert _contract_hash(f"data.path=[{a}]") == ha  # the same data, the same contract
    write_dataset(a, text_docs(4, length=500), tokenizer=BYTES)  # other data under the same prefix
    assert _contract_hash(f"data.path=[{a}]") != ha
    blended = _contract_hash(f"data.path=[0.3,{a},0.7,{b}]")
    assert blended != _contract_hash(f"data.path=[0.5,{a},0.5,{b}]")  # the blend's weights
    assert _contract_hash(f"data.path=[{a}]", 'data.split="98,2,0"') != _contract_hash(f"data.path=[{a}]")
    cached = _contract_hash(f"data.path=[{a}]", f"data.path_to_cache={tmp_path}/cache")
    assert cached == _contract_hash(f"data.path=[{a}]")  # where indices are cached is not what is measured


def test_mock_data_keeps_its_contract():
    """Mock runs' contract data section is what it was before real data (kind, path, seed)."""
    p = plan.make_plan(resolve(compose_config("stage=plan")))
    assert p["contract"]["data"] == {"kind": "mock", "path": None, "seed": 1234}
    assert p["label"] == "benchmark-only"


# ----------------------------------------------------------------------------- Megatron's form

@pytest.mark.parametrize("path,blend", [
    (["A"], (["A"], None)),
    (["A", "B"], (["A", "B"], None)),
    (["0.3", "A", "0.7", "B"], (["A", "B"], [0.3, 0.7])),
    (["30", "A", "70", "B"], (["A", "B"], [30.0, 70.0])),
])
def test_data_path_reads_as_megatron_reads_it(path, blend):
    from megatron.core.datasets.utils import get_blend_from_list

    assert contract.blend(path) == blend
    prefixes, weights = get_blend_from_list(path)
    assert (list(prefixes), None if weights is None else list(weights)) == blend


@pytest.mark.parametrize("path,why", [
    ([], "empty"),
    (["0.3", "A", "B"], "mixes weights and prefixes"),  # Megatron would take 0.3 for a prefix
    (["A", "0.3"], "mixes weights and prefixes"),
    (["-1", "A", "2", "B"], "not negative"),
    (["nan", "A"], "finite"),
])
def test_a_blend_megatron_would_misread_is_refused(path, why):
    with pytest.raises(ValueError, match=why):
        contract.blend(path)


def test_split_reads_as_megatron_reads_it():
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    for split in ("969,30,1", "98,2,0", "1", "0.8,0.2"):
        assert contract.parse_split(split) == pytest.approx(parse_and_normalize_split(split))
    for bad in ("0,1,0", "a,b", "1,2,3,4", "-1,2"):
        with pytest.raises(ValueError):
            contract.parse_split(bad)


def test_the_index_reader_agrees_with_megatron(dataset, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ours = write_dataset(tmp_path / "ours", text_docs(3), tokenizer=BYTES)  # the stdlib writer of the tests
    for prefix in (dataset[0], ours):
        facts, read = contract.read_index(prefix), IndexedDataset(prefix)
        assert facts.sequences == len(read) == facts.documents
        assert facts.tokens == int(read.sequence_lengths.sum())
    read = IndexedDataset(ours)  # held: its arrays are views of its memory map, closed when it is collected
    assert read[1].tolist() == text_docs(3)[1]


# ----------------------------------------------------------------------------- the job's data

def _megatron_data(prefix: str, cache: Path, *, dp: int, microbatches: int, mbs: int = 2):
    from types import SimpleNamespace

    from moe_hydra.job.data import MegatronData

    data = SimpleNamespace(path=[prefix], split="969,30,1", seed=7, mmap_bin_files=True)
    return MegatronData(data, vocab_size=1024, seq_length=64, micro_batch_size=mbs,
                        global_batch_size=mbs * dp * microbatches, microbatches=microbatches, samples=3 * 8,
                        cache_dir=str(cache))


def test_megatron_data_is_layout_invariant(tmp_path):
    """Sample k of step s is the same tokens whatever the data-parallel split: DP 2 x 1 micro-batch and DP 1 x 2
    micro-batches read the same global batch, in the same order."""
    import torch

    prefix = write_dataset(tmp_path / "ds", text_docs(6), tokenizer=BYTES)
    one = _megatron_data(prefix, tmp_path / "c1", dp=1, microbatches=4)
    two = _megatron_data(prefix, tmp_path / "c2", dp=2, microbatches=2)
    for step in range(3):
        a = [one.batch(step, 0, mb) for mb in range(4)]
        b = [two.batch(step, dp, mb) for dp in range(2) for mb in range(2)]
        for (ta, la), (tb, lb) in zip(a, b):
            assert torch.equal(ta, tb) and torch.equal(la, lb)
            assert ta.shape == (2, 64) and torch.equal(ta[:, 1:], la[:, :-1])  # labels: the next tokens
    assert one.tokenizer.eod == 256 and one.tokenizer.pad == 257


def test_megatron_data_refuses_a_token_the_model_cannot_embed(tmp_path):
    """What the plan could not read (a large .bin without a tokenizer description) the job stops at, by name."""
    prefix = write_dataset(tmp_path / "wide", [[1, 2, 2000, 3] * 100] * 4)
    data = _megatron_data(prefix, tmp_path / "c", dp=1, microbatches=1)
    with pytest.raises(ValueError, match=r"holds token id 2000, not below model\.vocab_size=1024"):
        data.batch(0, 0, 0)


@pytest.mark.slow
def test_a_two_process_run_on_real_data_builds_one_index(dataset, tmp_path):
    r, run = _train(tmp_path, "data.kind=megatron", f"data.path=[{dataset[0]}]", "hardware.devices_per_node=2",
                    "expert_mesh=ep2")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert res["status"] == "ok" and res["label"] == "training-equivalent"
    assert res["parallel"]["data_parallel_size"] == 2
    assert len(list((run / "data_cache").glob("*-GPTDataset-train-sample_index.npy"))) == 1
