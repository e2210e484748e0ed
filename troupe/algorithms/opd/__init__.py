"""On-policy distillation from a noisy expert (ALGORITHMS.md §B): its losses, the noisy
expert, and the tabular benchmark of §B.5."""
