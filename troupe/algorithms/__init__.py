"""Algorithms, registered by name; each module is imported only when its algorithm is asked for."""

from troupe.platform.registry import ALGORITHMS

# name -> the class, as "module:attr" (importing one algorithm never pays for the others)
for _name, _path in {
    "grpo": "troupe.algorithms.grpo:GRPO",
    "bpo": "troupe.algorithms.bpo:BPO",
    "bandit": "troupe.algorithms.bandit.algorithm:BanditAlgorithm",
    "ivdesign": "troupe.algorithms.ivdesign.algorithm:IVDesign",
}.items():
    ALGORITHMS.register_lazy(_name, _path)
