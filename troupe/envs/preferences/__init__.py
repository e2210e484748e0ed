"""Preference data for reward models steered by in-context demonstrations (ALGORITHMS.md §C):
episodes of k labelled demos and a query pair (`episodes`), §C.5's synthetic personas in numbers
(`personas`) and in text (`text_personas`), and multi-attribute datasets (`attributes`, `loaders`:
HelpSteer2, UltraFeedback, PKU-SafeRLHF) whose objectives are weightings of their attributes."""

from troupe.envs.preferences.attributes import AttributeSet, ResponseGroup
from troupe.envs.preferences.episodes import Comparison, Episode, FeatureEpisodes, demos_from_rows
from troupe.envs.preferences.loaders import (
           load_attribute_set,
           load_helpsteer2,
           load_pku_saferlhf,
           load_ultrafeedback,
)
from troupe.envs.preferences.personas import PersonaConfig, sample_feature_episodes, sample_personas
from troupe.envs.preferences.text_personas import ATTRIBUTES, TextPersonas

__all__ = ["ATTRIBUTES", "AttributeSet", "Comparison", "Episode", "FeatureEpisodes", "PersonaConfig", "ResponseGroup",
           "TextPersonas", "demos_from_rows", "load_attribute_set", "load_helpsteer2", "load_pku_saferlhf",
           "load_ultrafeedback", "sample_feature_episodes", "sample_personas"]
