"""`memwall bench speculative`: acceptance rate, tokens per target pass and speed-up of speculative decoding.

Runs plain decoding and speculative decoding of the same model on the same prompt, interleaved
(harness.run_interleaved), and reports:

- alpha, the fraction of tested guesses the target accepted, and the mean tokens per target pass;
- the formula's tokens per pass for that alpha, (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al.
  2023), which assumes every guess is accepted independently with probability alpha;
- tok/s of both and their ratio. Both rates leave the prompt's prefill out: plain decoding counts
  the tokens after the first over the time after it; speculative decoding counts every token over
  the time after its prefill (which holds all but the last prompt token);
- what a pass costs: milliseconds of draft and of verification per target pass, the verify pass
  relative to one plain decode step, and the speed-up those costs predict with the formula.
"""

from __future__ import annotations

from memwall.bench import harness, workload
from memwall.validate import count

PROMPTS = {
    # Copying text is where prompt lookup shines: the answer is in the prompt.
    "quote": "Repeat this paragraph word for word:\n\n" + workload.PROMPT_TEXT.strip(),
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def prompt_ids(tokenizer, prompt: str, vocab_size: int) -> list[int]:
    """Token ids of a named prompt (through the chat template when the model has one), or of
    literal text; seeded random ids for random-weight models, which have no tokenizer."""
    if tokenizer is None:
        return workload.make_prompt(32, vocab_size)
    text = PROMPTS.get(prompt, prompt)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def bench_speculative(
    model="smollm2-135m",
    draft: str = "self:8",
    k: int = 4,
    *,
    prompt: str = "quote",
    new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    repeats: int = 3,
    warmup: int = 1,
    device: str | None = None,
    dtype: str | None = None,
    tokenizer=None,
    progress: bool | None = None,
    fast: bool = False,
) -> dict:
    """Time plain vs speculative decoding and return a dict of medians and acceptance figures.

    model: a name (see `memwall.bench.workload`) or a memwall engine `Transformer` (then pass
    `tokenizer`). draft: "self:N" (first N layers), "lookup:N" (n-gram prompt lookup) or
    "model:NAME" (a separate model with the same vocabulary). fast: the target and a model draft
    run through `accelerate` (the device's speed path), in both the plain and the speculative
    runs; a self draft stays the readable engine's first layers.
    """
    from memwall.engine import Sampling, generate, shared_engine
    from memwall.engine.accelerate import accelerate
    from memwall.engine.drafts import parse_draft
    from memwall.engine.speculative import expected_tokens_per_pass, speculative_generate

    count("k", k, 1)
    count("new_tokens", new_tokens, 2)
    if isinstance(model, str):
        device = harness.resolve_device(device)
        dtype = harness.resolve_dtype(dtype, device)
        name = model
        hf_model, tokenizer = workload.load_model(model, dtype, device)
        target = shared_engine(hf_model)  # read into the engine: never two copies at once
        del hf_model
    else:
        target, name = model, type(model).__name__
        parameter = next(target.parameters())
        device, dtype = str(parameter.device), harness.dtype_name(parameter.dtype)

    def load_draft_model(draft_name):
        engine = shared_engine(workload.load_model(draft_name, dtype, device)[0])
        return accelerate(engine) if fast else engine

    draft_obj = parse_draft(draft, target, load_draft_model)
    if fast:
        target = accelerate(target)
    ids = prompt_ids(tokenizer, prompt, target.lm_head.out_features)
    stop = () if tokenizer is None or tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    sampling = Sampling(temperature=temperature, seed=seed if temperature > 0 else None)
    last, runs = {}, []

    def run_plain():
        out = generate(target, ids, new_tokens, sampling, stop_tokens=stop)
        last["plain"] = out.tokens
        decode_s = sum(out.step_times_s)
        return {
            "tok_per_s": (len(out.tokens) - 1) / decode_s if decode_s else float("nan"),
            "ms_per_step": 1e3 * decode_s / max(1, len(out.step_times_s)),
            "tokens": len(out.tokens),
        }

    def run_speculative():
        out = speculative_generate(
            target, draft_obj, ids, new_tokens, k, sampling, stop_tokens=stop
        )
        runs.append(out)
        passes = out.target_passes
        return {
            "tok_per_s": len(out.tokens) / (out.total_s - out.prefill_s),
            "draft_ms_per_pass": 1e3 * out.draft_s / passes,
            "verify_ms_per_pass": 1e3 * out.verify_s / passes,
            "tokens": len(out.tokens),
        }

    samples = harness.run_interleaved(
        {"plain": run_plain, "speculative": run_speculative},
        repeats,
        warmup,
        f"speculative {draft} k={k}",
        progress,
    )
    plain, spec = harness.medians(samples["plain"]), harness.medians(samples["speculative"])
    timed = runs[
        -repeats:
    ]  # acceptance figures pooled over the timed runs (identical runs when greedy)
    out = timed[-1]
    accepted, proposed = sum(r.accepted for r in timed), sum(r.proposed for r in timed)
    tested = accepted + sum(r.rejected for r in timed)
    passes = [n for r in timed for n in r.tokens_per_pass]
    alpha = accepted / tested if tested else float("nan")
    formula = expected_tokens_per_pass(alpha, k) if alpha == alpha else float("nan")
    step_ms = plain["ms_per_step"]
    pass_ms = spec["draft_ms_per_pass"] + spec["verify_ms_per_pass"]
    return {
        "model": name,
        "draft": draft,
        "k": k,
        "prompt": prompt if prompt in PROMPTS else "text",
        "prompt_tokens": len(ids),
        "new_tokens": new_tokens,
        "temperature": temperature,
        **harness.environment(device),
        "dtype": dtype,
        "fast": fast,
        "fallback": target.fallback_reason(target.new_cache(1, 1)) if fast else None,
        "repeats": repeats,
        "warmup": warmup,
        "tokens_generated": len(out.tokens),
        "target_passes": out.target_passes,
        "proposed": proposed,
        "accepted": accepted,
        "tested": tested,
        "acceptance_rate": alpha,
        "mean_tokens_per_pass": sum(passes) / len(passes),
        "formula_tokens_per_pass": formula,
        "identical_to_plain": out.tokens == last["plain"] if sampling.greedy else None,
        "plain_tok_per_s": plain["tok_per_s"],
        "speculative_tok_per_s": spec["tok_per_s"],
        "speedup": spec["tok_per_s"] / plain["tok_per_s"],
        "plain_ms_per_step": step_ms,
        "draft_ms_per_pass": spec["draft_ms_per_pass"],
        "verify_ms_per_pass": spec["verify_ms_per_pass"],
        "verify_over_step": spec["verify_ms_per_pass"] / step_ms,
        "formula_speedup": formula * step_ms / pass_ms,
        "tokens_per_pass": out.tokens_per_pass,
        "speedup_repeats": [
            s["tok_per_s"] / p["tok_per_s"]
            for s, p in zip(samples["speculative"], samples["plain"])
        ],
    }


# ---- command line ------------------------------------------------------------------------------


def add_cli(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "speculative",
        help="acceptance rate, tokens per pass and speed-up of speculative decoding",
        description="Plain vs speculative decoding on one prompt: acceptance rate alpha, tokens per target "
        "pass next to (1 - alpha^(k+1)) / (1 - alpha), and tok/s of both.",
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="target model name, or random:<catalog spec> for random weights",
    )
    parser.add_argument(
        "--draft",
        default="self:8",
        help="self:N (first N layers), lookup:N (n-gram prompt lookup) or model:NAME (default self:8)",
    )
    parser.add_argument(
        "--k", type=int, default=4, help="tokens drafted per target pass (default 4)"
    )
    parser.add_argument(
        "--prompt",
        default="quote",
        help=f"one of {', '.join(PROMPTS)} (default quote), or any text",
    )
    parser.add_argument(
        "--new-tokens", type=int, default=64, help="tokens generated per run (default 64)"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument(
        "--fast",
        action="store_true",
        help="run the target (and a model draft) through the device's speed path: the fused C "
        "step on a CPU, the compiled step as CUDA graphs on a GPU",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each; medians reported (default 3)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument(
        "--device", help=f"{' or '.join(harness.DEVICES)} (default: cuda if available)"
    )
    parser.add_argument(
        "--dtype", help=f"{', '.join(harness.DTYPES)} (default: fp32 on CPU, bf16 on CUDA)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run_cli)


def run_cli(args) -> int:
    result = bench_speculative(
        args.model,
        args.draft,
        args.k,
        prompt=args.prompt,
        new_tokens=args.new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        repeats=args.repeats,
        warmup=args.warmup,
        device=args.device,
        dtype=args.dtype,
        fast=args.fast,
    )
    harness.print_result(result, args.json)
    return 0
