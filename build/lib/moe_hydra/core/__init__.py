"""The pure core: the schema, the model's facts, the layout and its pipeline split, versions, FLOPs and
parameter counts, the contract, statistics. Standard library and omegaconf only: no torch, no megatron,
and nothing from the layers above (planning, job, launch, analysis, app)."""
