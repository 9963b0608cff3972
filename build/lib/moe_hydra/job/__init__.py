"""The job: builds the model with Megatron-Core, trains and measures it (the one layer that imports torch
and megatron, inside its functions); ``stage=fit`` builds ranks on a fake process group. Reads the core
and planning."""
