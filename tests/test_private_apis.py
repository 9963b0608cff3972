"""The private parts of Hydra, submitit, torch and Megatron-Core moe_hydra relies on are still there, each named with
what it is for.

pyproject.toml caps hydra-core, omegaconf, submitit and hydra-submitit-launcher at the minor releases tested;
within those ranges, a patch release may still move a private name. This test fails first, naming the name, the
installed version and the moe_hydra code that needs it, instead of a sweep failing later on a cluster.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "moe_hydra"

# (module, dotted attribute path, the distribution, what moe_hydra uses it for)
PRIVATE = [
    ("hydra._internal.utils", "get_args_parser", "hydra-core",
     "moe_hydra.commands._overrides: reads the command line as Hydra does, so only overrides are checked"),
    ("hydra._internal.utils", "create_config_search_path", "hydra-core",
     "moe_hydra.launch.compose: the search path of the real conf/ outside hydra.main"),
    ("hydra._internal.config_loader_impl", "ConfigLoaderImpl.load_configuration", "hydra-core",
     "moe_hydra.launch.compose: the master config outside hydra.main"),
    ("hydra._internal.config_loader_impl", "ConfigLoaderImpl.load_sweep_config", "hydra-core",
     "moe_hydra.launch.points.Composer: a point composed as Hydra's sweepers compose it"),
    ("hydra._internal.config_loader_impl", "ConfigLoaderImpl._parse_overrides_and_create_caching_repo", "hydra-core",
     "moe_hydra.launch.points.Composer: which overrides select a config group"),
    ("hydra._internal.config_loader_impl", "ConfigLoaderImpl._apply_overrides_to_config", "hydra-core",
     "moe_hydra.launch.points.Composer: value overrides applied as Hydra applies them"),
    ("hydra._internal.config_loader_impl", "get_overrides_dirname", "hydra-core",
     "moe_hydra.launch.points.Composer: hydra.job.override_dirname as Hydra sets it"),
    ("hydra._internal.core_plugins.basic_sweeper", "BasicSweeper.split_arguments", "hydra-core",
     "moe_hydra.launch.points / sequential: a sweep expanded as the basic sweeper expands it"),
    ("hydra.core.utils", "JobReturn._return_value", "hydra-core",
     "moe_hydra.commands.run.Outcomes, moe_hydra.launch.outcome: a point's state or its exception"),
    ("omegaconf._utils", "get_yaml_loader", "omegaconf",
     "moe_hydra.core.presets: the presets read with OmegaConf's YAML resolvers on libyaml's parser"),
    ("submitit.slurm.slurm", "SlurmInfoWatcher._make_command", "submitit",
     "moe_hydra.launch.slurm_jobs: sacct asked for Elapsed, Start and ExitCode too"),
    ("submitit.slurm.slurm", "SlurmInfoWatcher._last_status_check", "submitit",
     "moe_hydra.launch.follow: when Slurm was last asked (a file newer than that is newer news)"),
    ("submitit.slurm.slurm", "SlurmJob._cancel_command", "submitit",
     "moe_hydra.launch.follow.cancel: scancel, as submitit calls it"),
    ("submitit.core.utils", "pickle_load", "submitit",
     "moe_hydra.launch.slurm_jobs: the result pickle of a point's task 0"),
    ("torch.testing._internal.distributed.fake_pg", "FakeStore", "torch",
     "moe_hydra.job.fit: stage=fit's ranks join torch's fake process group at the target world size"),
    ("ruptures.detection._detection.ekcpd", "ekcpd_pelt_L2", "ruptures",
     "moe_hydra.core.steady.pelt: PELT's compiled kernel, loaded from its extension alone (the package's import costs "
     "half a second and a thread)"),
    ("megatron.core.parallel_state", "_global_process_group_list", "megatron-core",
     "moe_hydra.job.calibrate.release_model_parallel: every group Megatron-Core made, destroyed between layouts"),
    ("megatron.core.models.common.embeddings.rotary_pos_embedding", "RotaryEmbedding.forward.cache_clear",
     "megatron-core", "moe_hydra.job.calibrate.release_model_parallel: the lru_cache that keeps a group of every model"),
    ("megatron.core.models.common.embeddings.yarn_rotary_pos_embedding", "YarnRotaryEmbedding.forward.cache_clear",
     "megatron-core", "moe_hydra.job.calibrate.release_model_parallel: the lru_cache that keeps a group of every model"),
]


def _lookup(module: str, path: str):
    node = importlib.import_module(module)
    for part in path.split("."):
        if part == "_last_status_check":  # an instance attribute: set in __init__
            node = node(delay_s=1)
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("module,path,dist,why", PRIVATE, ids=[f"{m}.{p}" for m, p, _, _ in PRIVATE])
def test_a_private_api_moe_hydra_uses_is_there(module, path, dist, why):
    try:
        _lookup(module, path)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{module}.{path} is gone from {dist} {importlib.metadata.version(dist)} ({type(e).__name__}: "
                    f"{e}); {why}. Pin {dist} to the release tested in pyproject.toml, or port that code.",
                    pytrace=False)


def test_every_private_import_is_listed():
    """Each private module (``hydra._internal...``) or ``_name`` moe_hydra imports from Hydra, submitit or torch is in
    PRIVATE."""
    listed = {m for m, _, _, _ in PRIVATE} | {f"{m}.{p.split('.')[0]}" for m, p, _, _ in PRIVATE}
    found = set()
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("hydra", "submitit", "torch"):
                if "._" in node.module or any(a.name.startswith("_") for a in node.names):
                    found |= {f"{node.module}.{a.name}" if a.name.startswith("_") else node.module for a in node.names}
                    found |= {f"{node.module}.{a.name}" for a in node.names if not a.name.startswith("_")}
    unlisted = sorted(n for n in found if n not in listed and n.rpartition(".")[0] not in listed)
    assert not unlisted, f"private imports not in PRIVATE (say what each is for): {unlisted}"
