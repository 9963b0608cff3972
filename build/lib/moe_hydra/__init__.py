"""moe_hydra: plan, run and compare Mixture-of-Experts training on Megatron-Core, with Hydra.

The pure core (schema, arch, layout, pipeline, rules, flops, params, contract, plan) imports no
torch or megatron; the job is the one place that builds a Megatron-Core model.
"""

__version__ = "0.1.0"
