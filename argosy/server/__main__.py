"""`python -m argosy.server --model PATH ...`: the same as `argosy engine`."""

import argparse

from argosy.server.cli import add_engine_arguments, run_engine_server


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m argosy.server", description="Serve one engine over HTTP.")
    add_engine_arguments(parser)
    run_engine_server(parser.parse_args())


if __name__ == "__main__":
    main()
