"""BayesJudge (ALGORITHMS.md §G): online Bayesian aggregation of conflicting human and LLM pairwise judgments.

model: the generative model and the label stream; exact: the exact recursion (small n); smc: the
Rao–Blackwellised SMC and its ADF variant; pyro_reference: the batch reference in Pyro (NUTS, SVI);
baselines: majority vote, Dawid–Skene, the LLM judge in one or both orders; agreement: SMC vs exact;
reward: the posterior as GRPO's pairwise reward. The ``judge`` algorithm: algorithm (its graph and
loop), config, aggregator (the aggregator actor), evaluation (§G.5's metrics), report (claims,
sections, plots), word_task (the tiny LM judge's text comparison task).
"""
