"""`memwall bench serve`: TTFT and TPOT of any OpenAI-compatible endpoint under load.

The measuring code lives in memwall.serving.load, beside the server it is tested against.
"""

from memwall.serving.cli import add_bench_serve as add_cli

__all__ = ["add_cli"]
