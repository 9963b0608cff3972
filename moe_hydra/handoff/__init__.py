"""The hand-off between moe_hydra and the production trainers: a resolved plan exported as Megatron-LM's
``pretrain_gpt.py`` flags or Megatron-Bridge recipe overrides, and an existing command ingested back as moe_hydra
overrides, through one mapping table (docs/handoff.md).

- :mod:`~moe_hydra.handoff.table`: the mapping (moe_hydra key <-> Megatron-LM flag <-> Bridge key, with converters);
- :mod:`~moe_hydra.handoff.export`, :mod:`~moe_hydra.handoff.ingest`: the two directions;
- :mod:`~moe_hydra.handoff.text`: the printed command and how it is read back;
- :mod:`~moe_hydra.handoff.presets`: the config groups' presets as literal values (matching, leaving out);
- :mod:`~moe_hydra.handoff.layouts`: the layout search's exported top layouts.

The commands are ``python -m moe_hydra.export`` and ``python -m moe_hydra.ingest``.
"""
