"""The benchmark: ratios measured in one run. Start reading at README.md."""

from .report import FIGURES_FILE, METRIC_KEYS, PLOT_FILE, RESULTS_FILE
from .run import run_bench
from .sizes import DEFAULT_SIZES, QUICK_SIZES, Sizes

__all__ = [
    "DEFAULT_SIZES",
    "FIGURES_FILE",
    "METRIC_KEYS",
    "PLOT_FILE",
    "QUICK_SIZES",
    "RESULTS_FILE",
    "Sizes",
    "run_bench",
]
