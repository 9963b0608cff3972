"""moe_hydra: plan, run and compare Mixture-of-Experts training on Megatron-Core, with Hydra.

The layers, imported one way (tests/test_architecture.py): the pure core (``moe_hydra.core``: the schema, arch,
layout, pipeline, FLOPs, parameters, contract, statistics; no torch or megatron) <- planning (``moe_hydra.planning``:
the rules, the memory estimate, the step model, the layout search, the plan) <- the job (``moe_hydra.job``, the one
place that builds a Megatron-Core model) and the launchers (``moe_hydra.launch``) <- the commands
(``moe_hydra.commands``, each reachable as ``python -m moe_hydra.<name>`` and ``moe-hydra <name>``); the analysis
(``moe_hydra.analysis``) reads files. docs/architecture.md draws it.
"""

__version__ = "0.1.0"
