"""`memwall build-kernels`: compile the C kernels for this CPU ahead of time.

A reader's first forward pass then finds them built (Binder's postBuild runs this), instead of
waiting for the compiler. Prints each variant's library, or why it did not build, and which one
the engine uses here. --forget-paths drops the kernel-path choices measured on this machine.
"""

from __future__ import annotations

import json


def register_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "build-kernels", help="compile memwall's C kernels for this CPU ahead of time"
    )
    parser.add_argument(
        "--forget-paths",
        action="store_true",
        help="drop this machine's measured kernel-path choices (the next model use measures again, "
        "e.g. after a run on a busy machine)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="also time the kernel paths for the offline model's layers (fp32, int8, int4), so "
        "that the chapters find them chosen",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run_build_kernels)


def run_build_kernels(args) -> int:
    from memwall.engine.cpu import build
    from memwall.engine.cpu import kernels as cpu_kernels

    report = {"variants": build.build_all(), "in_use": cpu_kernels.variant()}
    if args.forget_paths:
        from memwall.engine.cpu import path_choice as paths

        paths.forget()
        report["forgot_paths"] = str(paths.cache_file())
    report["unavailable_reason"] = cpu_kernels.unavailable_reason()
    if args.calibrate and report["in_use"]:
        report["calibrated"] = calibrate_offline_model(quiet=args.json)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, where in report["variants"].items():
            print(f"{name:>9}: {where}")
        print(
            f"   in use: {report['in_use'] or 'none (' + str(report['unavailable_reason']) + ')'}"
        )
    return 0 if report["in_use"] else 1


# The shapes the chapters meet, timed here so that no chapter times them (a page must not depend
# on whether its builder had calibrated, and the timing's layer copies would add up to the memory
# budget to a chapter's peak): prompts and batches at each row bucket up to 64, and the one
# layer the book builds outside a model, chapter 3's 4096 x 8192 fp32 product at batch 1.
PROMPT_TOKENS = (4, 16, 64)
BATCH = 16
LONE_LAYER = (4096, 8192)  # out, in


def calibrate_offline_model(quiet: bool = False) -> list[str]:
    """Decode with the offline model in each format through `accelerate`, which times the kernel
    paths its layers meet (and keeps them): prompts of PROMPT_TOKENS tokens, batch-1 decode and a
    batch of BATCH; then the lone fp32 layer chapter 3 times."""
    import logging

    import torch

    from memwall import models, quality
    from memwall.engine import Transformer, generate
    from memwall.engine.accelerate import accelerate
    from memwall.engine.batch import generate_batch
    from memwall.engine.linear import Linear
    from memwall.engine.quant import quantize

    if not quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    hf_model, tokenizer = models.load("smollm2-135m")
    model = Transformer.from_hf(hf_model)
    del hf_model
    text = quality.eval_token_ids(tokenizer, max(PROMPT_TOKENS))
    done = []
    for fmt in ("fp32", "int8", "int4"):
        variant = model if fmt == "fp32" else quantize(model, fmt, inplace=False)
        if not quiet:
            print(f"calibrating {fmt} ...", flush=True)
        fast = accelerate(variant)
        for tokens in PROMPT_TOKENS:
            generate(fast, torch.tensor(text[:tokens]), 2)
        generate_batch(fast, [text[i : i + 4] for i in range(BATCH)], 2)
        done.append(fmt)
        del variant, fast
    out_features, in_features = LONE_LAYER
    with torch.inference_mode():
        lone = Linear(in_features, out_features).set_weight(torch.randn(LONE_LAYER))
        accelerate(lone)(torch.randn(1, in_features))
    done.append("fp32 {}x{}".format(*LONE_LAYER))
    return done
