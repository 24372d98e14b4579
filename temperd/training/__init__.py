"""Training: profiles derived from what a workload's threads did, and the trials that judge them."""
