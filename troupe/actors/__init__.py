"""One Ray actor class per role: rollout engines, scorers, rewards, learners, agents."""
