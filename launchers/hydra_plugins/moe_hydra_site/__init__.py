"""``MOE_HYDRA_SITE=<dir>``: a cluster's own settings (``<dir>/site/default.yaml``, the ``optional site``
entry of moe_hydra's defaults) join moe_hydra's config search path.

A Hydra ``SearchPathPlugin`` (Hydra finds these only in the ``hydra_plugins`` namespace); it touches only
moe_hydra's app, whose primary config source is ``pkg://moe_hydra.conf``.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from moe_hydra.core.schema import CONF_PACKAGE, site_dir


class MoeHydraSite(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        site = site_dir()
        ours = any(e.provider == "main" and e.path == f"pkg://{CONF_PACKAGE}" for e in search_path.get_path())
        if site and ours:
            search_path.append(provider="moe_hydra-site", path=f"file://{site}")
