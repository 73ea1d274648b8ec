"""Talking to Slurm: its commands (:mod:`.commands`) and what they answer, parsed (:mod:`.state`)."""
