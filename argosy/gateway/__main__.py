"""python -m argosy.gateway --config fleet.yaml (what `argosy gateway` runs)."""

import argparse
import sys

from argosy.gateway.cli import add_gateway_arguments, run_gateway

if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="argosy gateway")
    add_gateway_arguments(p)
    sys.exit(run_gateway(p.parse_args()))
