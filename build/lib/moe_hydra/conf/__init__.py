# moe_hydra's Hydra configs. Kept at the top of the repository, where a Hydra project keeps them, and installed
# as the package moe_hydra.conf (pyproject.toml maps it), so `pkg://moe_hydra.conf` finds them from any directory.
