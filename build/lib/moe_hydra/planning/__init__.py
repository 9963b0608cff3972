"""Planning: the legality rules, the memory estimate, the step-time model, the plan and the layout search.
Reads the core only; imports no torch or megatron."""
