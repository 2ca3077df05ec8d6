"""The CPU's speed path, beside the readable engine and applied only by `accelerate(model)`:
C kernels (kernels.py, built by build.py), the readable layers' twins that run them (linears.py),
the choice of kernel path by measurement (path_choice.py, calibrate.py), the decode step fused in
C (fast_decode.py) with its thread count chosen per step (`memwall.machine.step_threads`), and
`memwall build-kernels` (cli.py)."""

from __future__ import annotations


def chosen_paths() -> dict:
    """The machine key, the kernel variant, any pinned paths and the chosen path per format."""
    from memwall.engine.cpu import kernels as cpu_kernels
    from memwall.engine.cpu import path_choice as paths

    return {
        **paths.chosen_paths(),
        "variant": cpu_kernels.variant(),
        "unavailable_reason": cpu_kernels.unavailable_reason(),
    }


def info_rows() -> list[tuple[str, str]]:
    """(label, value) rows for `memwall info`: kernels in use and the chosen path per format."""
    report = chosen_paths()
    machine = report["machine"]
    rows = [
        ("C kernels", report["variant"] or f"none ({report['unavailable_reason']})"),
        (
            "kernel-path key",
            f"{machine['id']} ({machine['cpu_model']}, {machine['threads']} threads, "
            f"torch {machine['torch_version']}, kernels {machine['kernel_source']})",
        ),
    ]
    if report["pinned"]:
        rows.append(("pinned paths", report["pinned"]))
    if not report["paths"]:
        rows.append(("kernel paths", "none measured yet (measured on first use of a model)"))
    for fmt, choices in report["paths"].items():
        by_rows: dict[str, list[str]] = {}
        for where, path in choices.items():
            rows_label = where.rsplit("<= ", 1)[-1]
            by_rows.setdefault(rows_label, []).append(path)
        summary = ", ".join(
            f"<={label}: {'/'.join(sorted(set(paths)))}"
            for label, paths in sorted(by_rows.items(), key=lambda item: int(item[0].split()[0]))
        )
        rows.append((f"paths {fmt}", summary))
    return rows
