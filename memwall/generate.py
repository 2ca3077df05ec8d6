"""`memwall generate`: run memwall's engine on a prompt and report TTFT and time per output token."""

from __future__ import annotations

import json
import statistics


def register_cli(subparsers):
    parser = subparsers.add_parser(
        "generate", help="generate text with memwall's engine and time it"
    )
    parser.add_argument("prompt")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args) -> int:
    from memwall import models
    from memwall.engine import Sampling, Transformer, generate

    sampling = Sampling(args.temperature, args.top_p, args.seed)  # validates before the slow load
    hf_model, tokenizer = models.load(args.model)
    engine = Transformer.from_hf(hf_model)
    if args.chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    else:
        ids = tokenizer(args.prompt).input_ids
    result = generate(engine, ids, args.max_tokens, sampling, stop_tokens=[tokenizer.eos_token_id])
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    tpot = statistics.median(result.step_times_s) if result.step_times_s else None
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "prompt_tokens": len(ids),
                    "new_tokens": len(result.tokens),
                    "text": text,
                    "ttft_ms": result.ttft_s * 1e3,
                    "ms_per_token": tpot * 1e3 if tpot else None,
                },
                indent=2,
            )
        )
    else:
        print(text)
        timing = f"TTFT {result.ttft_s * 1e3:.0f} ms"
        if tpot:
            timing += f", {tpot * 1e3:.1f} ms per output token ({1 / tpot:.1f} tok/s)"
        print(f"\n[{len(ids)} prompt tokens, {len(result.tokens)} generated; {timing}]")
    return 0
