"""Real benches for the measured exercises, and the panel that runs a student's method on one.

The check grades a measuring function on pretend machines (``memwall.fakeclock``); this module
gives the same function a real bench: ``clock()`` is ``time.perf_counter`` and the work is real
(small numpy/torch kernels, a second or two in all), so the reader sees the method at work on
their own machine. ``measured_panel`` records every call the method makes and draws what it
means: a timeline, a sweep, a fitted line, bars. An unfinished function shows "not implemented
yet"; any other error is shown in the panel, never raised.
"""

import time

from memwall.widgets.exercise import NOT_IMPLEMENTED


class RealBench:
    """``clock()`` is ``time.perf_counter``; subclasses add the work."""

    def clock(self) -> float:
        return time.perf_counter()


class RealAB(RealBench):
    """A: a 160x160 matmul; B: a 200x200 one (about 1.95x the FLOPs)."""

    def __init__(self, a_size=160, b_size=200):
        import numpy as np

        rng = np.random.default_rng(0)
        self._a = rng.standard_normal((a_size, a_size), dtype=np.float32)
        self._b = rng.standard_normal((b_size, b_size), dtype=np.float32)

    def run_a(self):
        self._a @ self._a

    def run_b(self):
        self._b @ self._b


class RealSteps(RealBench):
    """``step()``: one token through a freshly built 2048x2048 fp32 layer (cold at first)."""

    def __init__(self, size=2048):
        import torch

        generator = torch.Generator().manual_seed(0)
        self._layer = torch.nn.Linear(size, size, bias=False)
        self._x = torch.randn(1, size, generator=generator)

    def step(self):
        import torch

        with torch.inference_mode():
            self._layer(self._x)


class RealCacheSweep(RealBench):
    """``read(n_bytes)`` sums a float32 buffer of that size (each size has its own buffer)."""

    def __init__(self):
        self._buffers = {}

    def read(self, n_bytes):
        import numpy as np

        if n_bytes not in self._buffers:
            self._buffers[n_bytes] = np.ones(max(1, int(n_bytes) // 4), dtype=np.float32)
        self._buffers[n_bytes].sum()


class RealKVSteps(RealBench):
    """``step(context)``: a weight matvec plus attention over ``context`` cached keys/values."""

    def __init__(self, max_context=4096, width=512, weight_rows=2048):
        import numpy as np

        rng = np.random.default_rng(0)
        self.kv_bytes_per_token = 2 * width * 4  # a key and a value row, float32
        self.kv_flops_per_token = 4 * width  # q.k and p.v, a multiply-add each
        self._weights = rng.standard_normal((weight_rows, width), dtype=np.float32)
        self._keys = rng.standard_normal((max_context, width), dtype=np.float32)
        self._values = rng.standard_normal((max_context, width), dtype=np.float32)
        self._query = rng.standard_normal(width, dtype=np.float32)

    def step(self, context):
        import numpy as np

        self._weights @ self._query
        scores = self._keys[:context] @ self._query
        weights = np.exp(scores - scores.max())
        weights @ self._values[:context]


class RealBatchSteps(RealBench):
    """``step(batch)``: ``batch`` rows times one 2048x2048 float32 weight matrix (16 MB)."""

    def __init__(self, size=2048, max_batch=64):
        import torch

        generator = torch.Generator().manual_seed(0)
        self.weight_bytes = size * size * 4
        self.flops_per_row = 2 * size * size
        self._weight = torch.randn(size, size, generator=generator)
        self._inputs = torch.randn(max_batch, size, generator=generator)

    def step(self, batch):
        import torch

        with torch.inference_mode():
            self._inputs[:batch] @ self._weight


class RealVerify(RealBench):
    """``decode()``: one row through a 2048x2048 fp32 layer; ``verify(k)``: k + 1 rows at once."""

    def __init__(self, size=2048, max_k=16):
        import torch

        generator = torch.Generator().manual_seed(0)
        self._weight = torch.randn(size, size, generator=generator)
        self._inputs = torch.randn(max_k + 1, size, generator=generator)

    def decode(self):
        self.verify(0)

    def verify(self, k):
        import torch

        with torch.inference_mode():
            self._inputs[: k + 1] @ self._weight


class RealFormats(RealBench):
    """``matvec(name)``: one token through a 2048x2048 linear layer stored as fp32, int8 or int4."""

    BYTES_PER_WEIGHT = {"fp32": 4.0, "int8": 1.0, "int4": 0.5 + 4 / 32}  # int4: group 32, 2 fp16

    def __init__(self, size=2048):
        import torch

        from memwall.engine.quant import Int4Linear, Int8Linear

        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(size, size, generator=generator) / size**0.5
        fp32 = torch.nn.Linear(size, size, bias=False)
        fp32.weight.data = weight
        self._layers = {"fp32": fp32, "int8": Int8Linear.from_weight(weight),
                        "int4": Int4Linear.from_weight(weight, group_size=32)}  # fmt: skip
        self._x = torch.randn(1, size, generator=generator)

    def matvec(self, name):
        import torch

        if name not in self._layers:
            raise ValueError(f"unknown format {name!r}; choose from {sorted(self._layers)}")
        with torch.inference_mode():
            self._layers[name](self._x)


class Recording:
    """Wraps a bench: the same methods, and a log of (method, argument, start, end) per call."""

    def __init__(self, bench):
        self._bench = bench
        self.calls = []
        self.origin = bench.clock()

    def clock(self):
        return self._bench.clock()

    def __getattr__(self, name):
        work = getattr(self._bench, name)
        if name.startswith("_") or not callable(work):
            return work

        def recorded(*args):
            start = self._bench.clock()
            work(*args)
            end = self._bench.clock()
            self.calls.append((name, args[0] if args else None, start - self.origin, end - start))

        return recorded


def run_recorded(student_fn, bench, **kwargs):
    """(result, calls, None), or (None, calls, a short reason to show instead)."""
    recording = Recording(bench)
    try:
        result = student_fn(recording, **kwargs)
    except NotImplementedError:
        return None, recording.calls, NOT_IMPLEMENTED
    except Exception as error:  # a student's bug belongs in the panel, not in a traceback
        return None, recording.calls, f"your function raised {type(error).__name__}: {error}"[:120]
    return result, recording.calls, None


def measured_panel(student_fn, make_bench, draw, **kwargs):
    """Run ``student_fn(bench, **kwargs)`` on a real bench now, and again on each click.

    ``draw(axes, calls, result)`` draws what the method measured; ``calls`` is the recorded
    list of (method, argument, start_s, seconds).
    """
    import ipywidgets as widgets

    bench = make_bench()
    button = widgets.Button(description="measure again")
    output = widgets.Output()

    def run(_=None):
        import matplotlib.pyplot as plt
        from IPython.display import display

        result, calls, problem = run_recorded(student_fn, bench, **kwargs)
        figure, axes = plt.subplots(figsize=(6.4, 3.6))
        if problem is None:
            draw(axes, calls, result)
        else:
            axes.text(0.5, 0.5, problem, transform=axes.transAxes, ha="center", va="center",
                      color="C3", fontsize=12, wrap=True)  # fmt: skip
        figure.tight_layout()
        output.clear_output(wait=True)
        with output:
            display(figure)
        plt.close(figure)

    button.on_click(run)
    run()
    return widgets.VBox([button, output])
