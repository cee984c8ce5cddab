"""Scaling laws (pure numpy/scipy): Chinchilla approach 3 (`fit`), approach 2 (`isoflop`), the
compute-optimal allocation (`optimal`) and plots (`plots`). Inputs are plain arrays of runs:
N parameters, D training tokens, C training FLOPs, L loss (nats per token). The ladder job
(elastic/launch/ladder.py, jobs/ladder.py) produces them; nothing here knows Ray or torch."""

from elastic.scaling.fit import (CHINCHILLA, BESIROGLU, ScalingFit, bootstrap_fit, fit_scaling_law, huber,
                                 predict_loss)
from elastic.scaling.isoflop import IsoFLOPResult, fit_parabola, isoflop_analysis, power_law_fit
from elastic.scaling.optimal import optimal_allocation, optimal_with_intervals

__all__ = ["CHINCHILLA", "BESIROGLU", "ScalingFit", "bootstrap_fit", "fit_scaling_law", "huber", "predict_loss",
           "IsoFLOPResult", "fit_parabola", "isoflop_analysis", "power_law_fit",
           "optimal_allocation", "optimal_with_intervals"]
