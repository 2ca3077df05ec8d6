"""`memwall generate`: run memwall's engine on a prompt and report TTFT and time per output token.

An instruct model answers a chat, so the prompt goes through the model's chat template unless
`--raw` asks for plain text continuation (a bare prompt makes an instruct model ramble or loop).
"""

from __future__ import annotations

import json
import statistics


def register_cli(subparsers):
    parser = subparsers.add_parser(
        "generate",
        help="generate text with memwall's engine and time it",
        description="Generate text with memwall's engine and report TTFT and time per token.",
    )
    parser.add_argument("prompt", help="the user's message (or the text to continue, with --raw)")
    parser.add_argument("--model", default="smollm2-135m", help="model name or hub id")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="continue the prompt as plain text instead of using the model's chat template",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run)


def prompt_ids(tokenizer, prompt: str, raw: bool = False) -> list[int]:
    """Token ids for `prompt`: wrapped in the chat template when the model has one, unless `raw`."""
    if raw or getattr(tokenizer, "chat_template", None) is None:
        return list(tokenizer(prompt).input_ids)
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


def run(args) -> int:
    from memwall import models
    from memwall.engine import Sampling, generate, shared_engine
    from memwall.validate import count

    count("--max-tokens", args.max_tokens)
    try:  # bytes that are not UTF-8 reach argv as lone surrogates
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the prompt is not valid UTF-8 text") from None
    # validated here, before the slow load
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    hf_model, tokenizer = models.load(args.model)
    engine = shared_engine(hf_model)  # read straight into the engine: one copy at any moment
    del hf_model
    ids = prompt_ids(tokenizer, args.prompt, raw=args.raw)
    result = generate(engine, ids, args.max_tokens, sampling, stop_tokens=[tokenizer.eos_token_id])
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    tpot = statistics.median(result.step_times_s) if result.step_times_s else None
    if args.json:
        report = {
            "model": args.model,
            "chat_template": not args.raw and getattr(tokenizer, "chat_template", None) is not None,
            "prompt_tokens": len(ids),
            "new_tokens": len(result.tokens),
            "text": text,
            "ttft_ms": result.ttft_s * 1e3,
            "ms_per_token": tpot * 1e3 if tpot else None,
        }
        print(json.dumps(report, indent=2))
        return 0
    print(text)
    timing = f"TTFT {result.ttft_s * 1e3:.0f} ms"
    if tpot:
        timing += f", {tpot * 1e3:.1f} ms per output token ({1 / tpot:.1f} tok/s)"
    print(f"\n[{len(ids)} prompt tokens, {len(result.tokens)} generated; {timing}]")
    return 0
