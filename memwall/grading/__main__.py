"""`python -m memwall.grading exercises|grade ...`: the grading commands without the `memwall` CLI."""

import argparse
import sys

from memwall.grading.cli import register_cli


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memwall.grading")
    register_cli(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: running notebooks were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
