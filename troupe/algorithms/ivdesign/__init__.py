"""ivdesign: adaptive instrumental-variable design (IVIG) over an empirical-Bayes GP-IV model."""

from troupe.algorithms.ivdesign.algorithm import IVDesign, IVDesignConfig

__all__ = ["IVDesign", "IVDesignConfig"]
