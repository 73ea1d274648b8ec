"""In-cluster elasticity: the programs Slurm calls (resume, suspend, resume-fail, PrologSlurmctld)."""
