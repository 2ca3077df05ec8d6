"""Exercises of chapter 2 (solution notebook): intensity, the roofline, the ridge point."""

from nbcells import check, code, exercise, md, notebook

SLUG = "ex02"


def cells():
    return [
        md("""
        # Exercises 2: arithmetic intensity and the roofline

        Four functions that rebuild the roofline from chapter 2. Write each one, compare it with
        memwall's reference using the sliders, then run its check cell (hidden random cases).

        Units: FLOPs, bytes, FLOP/s and bytes/s, never tera- or giga-; the widgets convert for display.
        """),
        code("""
        import math

        from memwall.widgets import compare_plot
        """),
        md("""
        ## Exercise 1: the intensity of a matmul

        Return the arithmetic intensity (FLOPs per byte) of $[m \\times k] \\cdot [k \\times n]$ when
        each element takes `bytes_per_element` bytes: count a multiply and an add for each term, and
        bytes for reading both inputs and writing the output once.
        """),
        exercise("ch02.intensity", "2mkn FLOPs over (mk + kn + mn) elements", """
        def matmul_intensity(m, k, n, bytes_per_element):
            \"\"\"FLOPs per byte moved of an [m x k] @ [k x n] matmul.\"\"\"
            ### BEGIN SOLUTION
            flops = 2 * m * k * n
            bytes_moved = (m * k + k * n + m * n) * bytes_per_element
            return flops / bytes_moved
            ### END SOLUTION
        """),
        md("""
        How does the intensity grow with the rows $m$ (the batch)? Where does it stop growing, and
        what sets that limit?
        """),
        code("""
        from memwall.grading.checks.ch02 import reference_matmul_intensity

        compare_plot(matmul_intensity, reference_matmul_intensity,
                     x=("m", [2**i for i in range(15)]),
                     sliders={"k": (256, 16384, 256, 4096), "n": (256, 16384, 256, 4096),
                              "bytes_per_element": [2, 4, 1]},
                     logx=True, logy=True, xlabel="rows m", ylabel="FLOPs per byte")
        """),
        check("ch02.intensity", "matmul_intensity", 2),
        md("""
        ## Exercise 2: the roofline

        A chip does at most `peak_flops` FLOP/s and moves at most `bandwidth` bytes/s. Return the
        highest FLOP rate a computation of the given `intensity` (FLOPs per byte) can reach.
        """),
        exercise("ch02.attainable", "limited by the peak or by intensity x bandwidth, whichever is lower", """
        def attainable_flops(intensity, peak_flops, bandwidth):
            \"\"\"Roofline bound on FLOP/s at this arithmetic intensity.\"\"\"
            ### BEGIN SOLUTION
            return min(peak_flops, intensity * bandwidth)
            ### END SOLUTION
        """),
        md("""
        The sliders start at an H100 SXM's dense bf16 numbers (989 TFLOP/s, 3.35 TB/s). Lower the
        bandwidth and watch the bend move right.
        """),
        code("""
        from memwall.grading.checks.ch02 import reference_attainable_flops


        def in_tflops(function):
            return lambda intensity, peak_tflops, bandwidth_tb_s: function(
                intensity, peak_tflops * 1e12, bandwidth_tb_s * 1e12) / 1e12


        compare_plot(in_tflops(attainable_flops), in_tflops(reference_attainable_flops),
                     x=("intensity", [0.1 * 1.25**i for i in range(62)]),
                     sliders={"peak_tflops": (10.0, 2000.0, 1.0, 989.0),
                              "bandwidth_tb_s": (0.1, 5.0, 0.05, 3.35)},
                     logx=True, logy=True, xlabel="FLOPs per byte", ylabel="attainable TFLOP/s")
        """),
        check("ch02.attainable", "attainable_flops", 2),
        md("""
        ## Exercise 3: the ridge point

        Return the intensity (FLOPs per byte) at which the roofline bends: below it a computation
        is memory-bound, above it compute-bound.
        """),
        exercise("ch02.ridge", "where peak = intensity x bandwidth", """
        def ridge_point(peak_flops, bandwidth):
            \"\"\"FLOPs per byte where the memory roof meets the compute roof.\"\"\"
            ### BEGIN SOLUTION
            return peak_flops / bandwidth
            ### END SOLUTION
        """),
        md("""
        For a fixed peak, plot the ridge against the memory bandwidth: faster memory lowers the
        intensity a program needs to keep the arithmetic units busy.
        """),
        code("""
        from memwall.grading.checks.ch02 import reference_ridge_point

        compare_plot(lambda bandwidth_tb_s, peak_tflops:
                         ridge_point(peak_tflops * 1e12, bandwidth_tb_s * 1e12),
                     lambda bandwidth_tb_s, peak_tflops:
                         reference_ridge_point(peak_tflops * 1e12, bandwidth_tb_s * 1e12),
                     x=("bandwidth_tb_s", [0.1 * i for i in range(1, 51)]),
                     sliders={"peak_tflops": (10.0, 2000.0, 1.0, 989.0)},
                     logy=True, xlabel="memory bandwidth (TB/s)",
                     ylabel="ridge point (FLOPs per byte)")
        """),
        check("ch02.ridge", "ridge_point", 1),
        md("""
        ## Exercise 4: how many rows until compute-bound?

        A linear layer has a $[k \\times n]$ weight. Return the smallest number of rows $m \\geq 1$
        (tokens in a batch) whose matmul reaches the chip's ridge point, i.e. whose intensity is at
        least `peak_flops / bandwidth`. Some chips cannot be reached at all: however large $m$
        grows, the intensity stays below $2kn / (b(k + n))$. Return `math.inf` then.
        You may reuse your functions from above.
        """),
        exercise("ch02.rows_to_ridge", "search m = 1, 2, 3, ... (or solve intensity(m) >= ridge for m)", """
        def rows_to_reach_ridge(k, n, bytes_per_element, peak_flops, bandwidth):
            \"\"\"Smallest m whose [m x k] @ [k x n] matmul is compute-bound on this chip
            (math.inf if none).\"\"\"
            ### BEGIN SOLUTION
            ridge = peak_flops / bandwidth
            if 2 * k * n / (bytes_per_element * (k + n)) <= ridge:
                return math.inf
            m = 1
            while matmul_intensity(m, k, n, bytes_per_element) < ridge:
                m += 1
            return m
            ### END SOLUTION
        """),
        md("""
        How wide must a layer be before a GPU can be kept busy at all, and how many tokens per step
        does that take? The sliders start at the H100's numbers, 16-bit weights, square layers.
        Widths that can never reach the ridge (`math.inf`) are left out of the plot.
        """),
        code("""
        from memwall.grading.checks.ch02 import reference_rows_to_reach_ridge


        def for_square_layer(function):
            return lambda width, bytes_per_element, peak_tflops, bandwidth_tb_s: function(
                width, width, bytes_per_element, peak_tflops * 1e12, bandwidth_tb_s * 1e12)


        compare_plot(for_square_layer(rows_to_reach_ridge),
                     for_square_layer(reference_rows_to_reach_ridge),
                     x=("width", [256 * 2**i for i in range(8)]),
                     sliders={"bytes_per_element": [2, 1, 4],
                              "peak_tflops": (10.0, 2000.0, 1.0, 989.0),
                              "bandwidth_tb_s": (0.1, 5.0, 0.05, 3.35)},
                     logx=True, logy=True, xlabel="layer width k = n",
                     ylabel="rows to reach the ridge")
        """),
        check("ch02.rows_to_ridge", "rows_to_reach_ridge", 3),
    ]


def build():
    return notebook(SLUG, cells())
