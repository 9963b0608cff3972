"""moe_hydra.core.presets reads the presets as OmegaConf does."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from moe_hydra.core import presets
from moe_hydra.core.schema import conf_dir

FILES = sorted(conf_dir().rglob("*.yaml"))


def test_every_config_file_reads_as_omegaconf_loads_it():
    """Every value and type (1e-5 a float, ${...} kept, no dates), on every file under conf/."""
    assert len(FILES) > 50
    for path in FILES:
        mine = presets.read_yaml(path)
        theirs = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert mine == theirs and repr(mine) == repr(theirs), path


def test_a_float_without_a_dot_and_a_date_read_as_omegaconf_reads_them(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("lr: 1e-5\nday: 2026-12-04\nref: ${train.lr}\nn: 3\n")
    assert presets.read_yaml(f) == {"lr": 1e-5, "day": "2026-12-04", "ref": "${train.lr}", "n": 3}
    assert presets.read_yaml(f) == OmegaConf.to_container(OmegaConf.load(f), resolve=False)


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_file_is_an_empty_mapping(tmp_path, text):
    f = tmp_path / "x.yaml"
    f.write_text(text)
    assert presets.read_yaml(f) == {}
