"""The benchmark: ratios measured in one run. Start reading at README.md."""

from .legacy import run_bench

__all__ = ["run_bench"]
