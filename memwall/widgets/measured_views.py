"""What each measured exercise's panel draws: ``draw(axes, calls, result)`` functions.

``calls`` is the list of (method, argument, start_s, seconds) that the student's method made on
a real bench (``memwall.widgets.measured.Recording``); ``result`` is what it returned.
"""


def ab_timeline(axes, calls, result):
    """Every A and B call as a dot at its start time: drift shows as a slope, outliers as spikes."""
    for name, colour in (("run_a", "C0"), ("run_b", "C1")):
        points = [(start, seconds * 1e3) for method, _, start, seconds in calls if method == name]
        if points:
            axes.plot(*zip(*points), ".", color=colour, label=name)
    axes.set_xlabel("time since the first call (s)")
    axes.set_ylabel("call time (ms)")
    axes.set_title(f"your method: B takes {_number(result)}x as long as A")
    axes.legend(loc="best")


def warmup_cut(axes, calls, result):
    """Every step's time in order, with the steps your detector would drop shaded."""
    times = [seconds * 1e3 for method, _, _, seconds in calls if method == "step"]
    axes.plot(range(len(times)), times, ".-", color="C0", label="each step")
    axes.axvspan(-0.5, int(result) - 0.5, color="C3", alpha=0.2, label=f"dropped: {int(result)}")
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("step time (ms)")
    axes.legend(loc="upper right")


def cache_sweep(llc_bytes):
    """GB/s of every read against its size, with your cliff and the cache size the OS reports."""

    def draw(axes, calls, result):
        reads = [(size, size / seconds / 1e9) for method, size, _, seconds in calls
                 if method == "read" and seconds > 0]  # fmt: skip
        if reads:
            axes.plot(*zip(*reads), ".", color="C0", alpha=0.6, label="each read")
        axes.axvline(result, color="C3", label=f"your cliff: {_mib(result)}")
        if llc_bytes:
            axes.axvline(llc_bytes, color="gray", linestyle="--", label=f"LLC: {_mib(llc_bytes)}")
        axes.set_xscale("log")
        axes.set_xlabel("buffer size (bytes)")
        axes.set_ylabel("GB/s")
        axes.legend(loc="best")

    return draw


def kv_fit(bandwidth_gb_s, kv_bytes_per_token):
    """Step times against the context, your line through them, and the GB/s that slope means."""

    def draw(axes, calls, result):
        steps = [(context, seconds * 1e3) for method, context, _, seconds in calls
                 if method == "step"]  # fmt: skip
        axes.plot(*zip(*steps), ".", color="C0", alpha=0.5, label="each step")
        slope = float(result["s_per_token"])
        contexts = sorted({context for context, _ in steps})
        offset = sorted(ms - slope * 1e3 * c for c, ms in steps)[len(steps) // 2]
        axes.plot(contexts, [offset + slope * 1e3 * c for c in contexts], color="C3",
                  label=f"your slope: {slope * 1e9:.1f} ns/token")  # fmt: skip
        achieved = kv_bytes_per_token / slope / 1e9 if slope > 0 else float("nan")
        axes.set_title(f"cache reads at {achieved:.1f} GB/s = {achieved / bandwidth_gb_s:.0%} "
                       f"of measured bandwidth: {result['bound']}-bound", fontsize=10)  # fmt: skip
        axes.set_xlabel("context (tokens)")
        axes.set_ylabel("step time (ms)")
        axes.legend(loc="best")

    return draw


def batch_speedups(batches, bench, bandwidth_gb_s, peak_gflops):
    """Your measured speed-ups against the roofline's: weights read once per step, FLOPs per row."""

    def draw(axes, calls, result):
        def floor_s(batch):
            return max(bench.weight_bytes / (bandwidth_gb_s * 1e9),
                       batch * bench.flops_per_row / (peak_gflops * 1e9))  # fmt: skip

        ideal = [b / floor_s(b) / (batches[0] / floor_s(batches[0])) for b in batches]
        axes.plot(batches, ideal, "--", color="gray", label="roofline (measure())")
        axes.plot(batches, [float(v) for v in result], "o-", color="C0", label="your measurement")
        axes.set_xscale("log", base=2)
        axes.set_yscale("log", base=2)
        axes.set_xlabel("batch")
        axes.set_ylabel(f"tokens/s relative to batch {batches[0]}")
        axes.legend(loc="best")

    return draw


def verify_costs(note=None):
    """Each verify pass in decode steps against k, and your line 1 + extra cost x k."""

    def draw(axes, calls, result):
        decodes = sorted(seconds for method, _, _, seconds in calls if method == "decode")
        step = decodes[len(decodes) // 2] if decodes else float("nan")
        passes = [(k, seconds / step) for method, k, _, seconds in calls if method == "verify"]
        if passes:
            axes.plot(*zip(*passes), ".", color="C0", alpha=0.5, label="each verify pass")
            ks = sorted({k for k, _ in passes})
            axes.plot(ks, [1 + float(result) * k for k in ks], color="C3",
                      label=f"your fit: 1 + {float(result):.3f} k")  # fmt: skip
            axes.plot(ks, [k + 1 for k in ks], "--", color="gray", label="k + 1 plain steps")
        axes.set_xlabel("guesses k (the pass covers k + 1 tokens)")
        axes.set_ylabel("verify pass / decode step")
        axes.set_title(note(result) if note else "", fontsize=10)
        axes.legend(loc="upper left")

    return draw


def format_speedups(bytes_per_weight):
    """Your speed-up of each format over fp32, beside the bytes it saves."""

    def draw(axes, calls, result):
        names = list(result)
        saved = [bytes_per_weight["fp32"] / bytes_per_weight[name] for name in names]
        positions = range(len(names))
        axes.bar([p - 0.2 for p in positions], saved, 0.4, color="lightgray",
                 label="fewer bytes (x)")  # fmt: skip
        axes.bar([p + 0.2 for p in positions], [float(result[n]) for n in names], 0.4,
                 color="C0", label="your measured speed-up (x)")  # fmt: skip
        axes.set_xticks(list(positions), names)
        axes.set_ylabel("times fp32")
        axes.legend(loc="best")

    return draw


def _number(value):
    try:
        return f"{float(value):.2f}"
    except (TypeError, ValueError):
        return repr(value)[:20]


def _mib(n_bytes):
    return f"{n_bytes / 2**20:.3g} MiB"
