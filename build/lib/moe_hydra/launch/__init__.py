"""The launchers: this machine's processes (local), Slurm through hydra-submitit-launcher, the layout
sweeper, and the state of a sweep's points. They start the job; they read the core, planning and
analysis."""
