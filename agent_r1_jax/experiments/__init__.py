"""Experiments that reproduce the paper's comparisons with the trainer and the evaluation (`paper_tables`)."""
