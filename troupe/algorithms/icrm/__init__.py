"""ICRM, the variational in-context reward model of ALGORITHMS.md §C: `posterior` (the Beta
posterior, the negative ELBO, its optima and product of experts, as pure functions), `model` (the
two heads and a transformer over feature-vector episodes) and `training` (the fitting loop and
pairwise accuracy)."""
