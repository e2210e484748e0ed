"""ICRM, the variational in-context reward model of ALGORITHMS.md §C: `posterior` (the Beta
posterior, the negative ELBO, its optima and product of experts, as pure functions), `model` (the
two heads and a transformer over feature-vector episodes), `training` (the fitting loop and
pairwise accuracy), `text` (the same model over text, on a causal LM backbone), `judge_baseline`
(§C.3's generative judge), `metrics` (§C.4), `learner` (the learner actor), `analysis` (the
report), `reward` (ICRM as an RL reward) and `algorithm` (`troupe run icrm`)."""
